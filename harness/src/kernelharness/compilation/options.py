"""How a build compiles, never what it makes: one frozen object, made from the run settings
(HarnessSettings.build_options, params `harness.run`) and sent to every builder with each
build. None of these is part of a build's key, since a source builds to the same module
either way; each only changes how fast it gets there. Benchmarks and tests set them in the
settings (bench/build_breakdown.py's variants turn one off each)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BuildOptions:
    use_pch: bool  # the full torch prelude precompiled per flag set (gcc)
    light_headers: bool  # cuda units first without <torch/extension.h>
    minimal_headers: bool  # main.cpp and cuda units first against their minimal prelude
    slim_op_headers: bool  # the minimal prelude's operator headers as slim copies
    share_host_objects: bool  # one main.cpp object per text and command, shared by builds
    wait_for_prelude_header: bool  # a main.cpp waits for its prelude's header being made

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, values: dict) -> BuildOptions:
        return cls(**values)
