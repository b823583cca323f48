"""Block settings that travel with a checkpoint: what the model needs besides its weights
to be trained and decoded as a block-diffusion (or plain causal) language model."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import ModelError

BLOCK_SETTINGS_FILE = "block_diffusion.json"


@dataclass(frozen=True)
class BlockSettings:
    """`causal` models predict the next token (label shift); block-diffusion models predict
    the token at the same position (no shift) and need a mask token."""

    block_size: int
    mask_token_id: int | None
    pad_token_id: int
    stop_token_ids: tuple[int, ...]
    causal: bool = False
    source: str = field(default="", compare=False)  # what it was loaded from, for messages

    def __post_init__(self):
        if self.block_size < 1:
            raise ModelError(f"block_size must be >= 1, got {self.block_size}")
        if not self.causal and self.mask_token_id is None:
            raise ModelError(
                f"{self.source or 'model'}: a block-diffusion model needs a mask token id. "
                "Set mask_token_id in its params.yaml model entry."
            )

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("source")
        data["stop_token_ids"] = list(self.stop_token_ids)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def save(self, folder: str | Path) -> None:
        Path(folder, BLOCK_SETTINGS_FILE).write_text(self.to_json())

    @classmethod
    def load(cls, folder: str | Path) -> BlockSettings:
        path = Path(folder, BLOCK_SETTINGS_FILE)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: cannot read block settings ({exc}).") from exc
        data["stop_token_ids"] = tuple(data["stop_token_ids"])
        return cls(**data, source=str(folder))
