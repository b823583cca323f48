"""Build steps without ninja: the ninja file's commands, CPU slots, and the nvcc host pass
against a precompiled prefix (on a tiny stand-in for cudafe++'s output, built with the
system C++ compiler in well under a second; no nvcc, no torch headers)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
import time

import pytest
from kernelharness.compilation import compile_steps, nvcc_split, preludes

NINJA = """ninja_required_version = 1.3
cxx = c++
cflags = -DX=1 -O3
ldflags = -shared

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out
  depfile = $out.d

rule link
  command = $cxx $in $ldflags -o $out

build main.o: compile /tmp/a$:b/main.cpp
build m.so: link main.o

default m.so
"""


def test_plan_expands_commands_as_ninja_would(tmp_path):
    (tmp_path / "build.ninja").write_text(NINJA)
    compiles, link = compile_steps.plan(tmp_path / "build.ninja")
    assert [s["command"] for s in compiles] == [
        "c++ -MMD -MF main.o.d -DX=1 -O3 -c /tmp/a:b/main.cpp -o main.o"]
    assert link["command"] == "c++ main.o -shared -o m.so"


def test_cpu_slots_bound_concurrency(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_steps.SLOTS_ENV, "2")
    active, peak, lock = [0], [0], threading.Lock()

    def work():
        with compile_steps.cpu_slot(tmp_path):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.05)
            with lock:
                active[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2


# What cudafe++ writes: headers first (naming the module id), then the candidate's file.
FAKE_UNIT = """# 1 "cuda.cu"
# 1 "/fake/header.h"
namespace _GLOBAL__N_{mid} __attribute__((visibility("hidden"))) {{ inline int base() {{ return 40; }} }}
using namespace ::_GLOBAL__N_{mid};
template <class T> T twice(T x) {{ return x + x; }}
# 3 "cuda.cu"
#define _NV_ANON_NAMESPACE _GLOBAL__N_{mid}
extern "C" int answer_{k}() {{ return base() + twice({k}); }}
"""


def _host_unit(folder, mid: str, k: int) -> str:
    keep = folder / "nvcc"
    keep.mkdir(parents=True)
    (keep / "cuda.cudafe1.cpp").write_text(FAKE_UNIT.format(mid=mid, k=k))
    (keep / "cuda.module_id").write_text(mid)
    return "c++ -c -x c++ -O2 -fPIC nvcc/cuda.cudafe1.cpp -o cuda.cuda.o"


def _host_pass(line: str, folder, cache) -> str:
    env = dict(os.environ)
    header = nvcc_split._prepare_host(line, folder, folder / "nvcc", cache, env)
    return nvcc_split._host_pass(line, header, folder, cache, [], env)


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_host_pass_shares_one_precompiled_prefix(tmp_path):
    cache = tmp_path / "cache"
    notes = []
    for k, mid in ((1, "_aaaa1111_7_cuda_cu_0001"), (2, "_bbbb2222_7_cuda_cu_0002"),
                   (3, "_cccc3333_7_cuda_cu_0003")):
        folder = tmp_path / f"b{k}"
        line = _host_unit(folder, mid, k)
        notes.append(_host_pass(line, folder, cache))
        assert (folder / "cuda.cuda.o").is_file()
        # the object computes what the plain host pass's object computes
        main = folder / "main.cpp"
        main.write_text(f'extern "C" int answer_{k}();\nint main() {{ return answer_{k}(); }}\n')
        exe = folder / "a.out"
        subprocess.run(["c++", str(main), str(folder / "cuda.cuda.o"), "-o", str(exe)],
                       check=True)
        assert subprocess.run([str(exe)]).returncode == 40 + 2 * k
    # made on the prefix's second build, used by the third (other module ids, same prefix)
    assert notes == ["host-pch:first-seen", "host-pch:built", "host-pch:hit"]
    assert len([e for e in (cache / "pch-cuda-host").iterdir() if e.is_dir()]) == 1


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_host_pass_falls_back_without_a_module_id(tmp_path):
    folder = tmp_path / "b"
    line = _host_unit(folder, "_cccc_7_cuda_cu_3", 3)
    (folder / "nvcc" / "cuda.module_id").unlink()
    note = _host_pass(line, folder, tmp_path / "cache")
    assert note == "host-pch:plain" and (folder / "cuda.cuda.o").is_file()


def test_a_queued_build_reports_waiting_until_it_gets_a_slot(tmp_path, monkeypatch):
    """Waiting for a CPU slot sends heartbeats (the build's timeout must not count the
    queue); taking the slot sends "build"; a holder of a slot sends nothing more."""
    monkeypatch.setenv(compile_steps.SLOTS_ENV, "1")
    monkeypatch.setattr(compile_steps, "HEARTBEAT_S", 0.05)
    phases: list[str] = []
    monkeypatch.setattr(compile_steps, "_wait_state", {"held": 0, "hook": None, "last": 0.0})
    compile_steps.set_wait_hook(phases.append)
    slot = tmp_path / "slots" / "1" / "0.lock"
    slot.parent.mkdir(parents=True)
    other = open(slot, "w")  # another builder holds the only slot
    fcntl.flock(other, fcntl.LOCK_EX)
    done = threading.Event()

    def build():
        with compile_steps.cpu_slot(tmp_path):
            time.sleep(0.3)  # compiling: no heartbeats now
        done.set()

    thread = threading.Thread(target=build)
    thread.start()
    time.sleep(0.5)
    assert phases and set(phases) == {"build:queued"}
    other.close()  # the slot frees up
    thread.join(timeout=10)
    assert done.is_set()
    assert phases[-1] == "build" and phases.count("build") == 1


CU = ("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
      "#include <torch/extension.h>\n__global__ void k() {}\n")


def _fake_nvcc(monkeypatch, fail_without_extension: bool):
    """Records the text each compile saw; fails a light compile when told to."""
    seen = []

    def compile_once(step, folder, cache, log, after=None):
        text = (folder / "cuda.cu").read_text()
        seen.append(text)
        if fail_without_extension and "<torch/extension.h>" not in text.replace(
                nvcc_split._LEFT_OUT, ""):
            raise compile_steps.StepError("error: namespace py is undefined")
        return "host-pch:built"

    monkeypatch.setattr(nvcc_split, "_compile_cuda", compile_once)
    return seen


@pytest.mark.parametrize("needs_full", [False, True])
def test_light_headers_compile_first_and_fall_back_on_error(tmp_path, monkeypatch, needs_full):
    (tmp_path / "cuda.cu").write_text(CU)
    seen = _fake_nvcc(monkeypatch, needs_full)
    log: list[str] = []
    note = nvcc_split.compile_cuda({"in": ["cuda.cu"], "command": "nvcc"}, tmp_path, tmp_path,
                                   log, light_headers=True)
    assert "#include <torch/extension.h>" not in seen[0]
    assert seen[0].count("\n") == CU.count("\n")  # same lines: messages point at the source
    if needs_full:
        assert note.endswith(",full-headers") and seen[1] == CU and len(seen) == 2
        assert "compiling as written" in log[0]
    else:
        assert note.endswith(",light-headers") and len(seen) == 1
    assert (tmp_path / "cuda.cu").read_text() == CU  # the folder keeps the candidate's text


@pytest.mark.parametrize("text,light", [(CU, False),  # switched off
                                        (CU.replace("#include <torch/types.h>\n", ""), True)])
def test_light_headers_leave_other_sources_alone(tmp_path, monkeypatch, text, light):
    # without load_inline's torch/types.h first (no_implicit_headers) nothing is left out
    (tmp_path / "cuda.cu").write_text(text)
    seen = _fake_nvcc(monkeypatch, True)
    note = nvcc_split.compile_cuda({"in": ["cuda.cu"], "command": "nvcc"}, tmp_path, tmp_path,
                                   [], light_headers=light)
    assert seen == [text] and note == "host-pch:built"


@pytest.mark.parametrize("error,compiles", [
    ('error: namespace "torch" has no member "nn"', 3),  # missing: each lighter tier, then all
    ('error: expected a ";"', 2),  # the source's own error: straight to the headers as written
])
def test_minimal_headers_first_then_lighter_tiers_only_for_missing_declarations(
        tmp_path, monkeypatch, error, compiles):
    (tmp_path / "cuda.cu").write_text(CU)
    seen = []

    def compile_once(step, folder, cache, log, after=None):
        text = (folder / "cuda.cu").read_text()
        seen.append(text)
        if text != CU:
            raise compile_steps.StepError(error)
        return "host-pch:built"

    monkeypatch.setattr(nvcc_split, "_compile_cuda", compile_once)
    log: list[str] = []
    note = nvcc_split.compile_cuda({"in": ["cuda.cu"], "command": "nvcc"}, tmp_path, tmp_path,
                                   log, light_headers=True, minimal_headers=True)
    assert "/preludes/" in seen[0] and "<torch/" not in seen[0]  # the minimal prelude first
    assert len(seen) == compiles and seen[-1] == CU and note.endswith(",full-headers")
    if compiles == 3:
        assert seen[1] == CU.replace("#include <torch/extension.h>", nvcc_split._LEFT_OUT)
    assert (tmp_path / "cuda.cu").read_text() == CU


def test_slim_operator_headers_give_way_to_the_originals_a_unit_also_includes(
        tmp_path, monkeypatch):
    """cuda.cu's prelude uses slim operator headers; a unit whose own includes reach an
    original of one (here: the preprocessed text names ATen/ops/empty_like.h) stops after
    the first preprocessing pass and compiles with the operators' own headers."""
    (tmp_path / "cuda.cu").write_text(CU)
    seen, checks = [], []

    def compile_once(step, folder, cache, log, after=None):
        text = (folder / "cuda.cu").read_text()
        seen.append(text)
        checks.append(after is not None)
        if after is not None:
            keep = folder / "nvcc"
            keep.mkdir(exist_ok=True)
            (keep / "cuda.cpp4.ii").write_text(
                '# 1 "cuda.cu"\n# 1 "/x/torch/include/ATen/ops/empty_like.h" 1\nint a;\n')
            after("cuda:dryrun")  # only the preprocessing pass is read
            after("cuda:preprocess")
        return "host-pch:built"

    monkeypatch.setattr(nvcc_split, "_compile_cuda", compile_once)
    log: list[str] = []
    note = nvcc_split.compile_cuda({"in": ["cuda.cu"], "command": "nvcc"}, tmp_path, tmp_path,
                                   log, light_headers=True, minimal_headers=True)
    assert checks == [True, False] and note == "host-pch:built,minimal-headers"
    first, second = (preludes.prelude_path(text).read_text() for text in seen)
    assert "slim copy of ATen/TensorOperators.h" in first and "slim copy" not in second
    assert "includes ATen/ops/empty_like.h" in log[0] and "stopped" in log[0]
    assert (tmp_path / "cuda.cu").read_text() == CU


def test_slim_check_reads_the_first_preprocessing_pass_once(tmp_path):
    keep = tmp_path / "nvcc"
    keep.mkdir()
    ii = keep / "cuda.cpp4.ii"
    ii.write_text('# 1 "cuda.cu"\n# 1 "/c/preludes/slim/ab.h" 1\n# 7 "/t/ATen/ops/cat_ops.h"\n')
    check = nvcc_split.slim_check(keep, ["ATen/ops/cat.h", "ATen/TensorOperators.h"])
    check("cuda:preprocess")  # no original of a slimmed header: nothing to say
    ii.write_text('# 3 "/t/include/ATen/ops/cat.h" 1\n')
    check("cuda:preprocess")  # read once: the device pass's text is the same includes
    again = nvcc_split.slim_check(keep, ["ATen/ops/cat.h"])
    with pytest.raises(nvcc_split.HeaderConflict, match="ATen/ops/cat.h"):
        again("cuda:preprocess")


def test_only_precompiled_header_trouble_triggers_a_build_without_it():
    from kernelharness.compilation.builder import _PCH_TROUBLE

    ordinary = ("In file included from <python>/torch/include/torch/extension.h:6,\n"
                "                 from <cache>/<build>/main.cpp:1:\n"
                "main.cpp:4:61: error: 'kernel' was not declared in this scope")
    assert not _PCH_TROUBLE.search(ordinary)
    for trouble in ("warning: <cache>/pch/abc/torch/extension.h.gch: not used because "
                    "`__OPTIMIZE__' not defined [-Winvalid-pch]",
                    "cc1plus: error: one or more PCH files were found, but they were invalid;"
                    " precompiled header was invalid",
                    "main.cpp:1:10: fatal error: torch/extension.h: No such file or directory"):
        assert _PCH_TROUBLE.search(trouble), trouble



FAILFAST_NINJA = """ninja_required_version = 1.3

rule bad
  command = touch bad_started && sleep 0.3 && echo 'main.cpp: error: undeclared name' >&2 && exit 1

rule slow
  command = touch started && sh -c 'sleep 41.25; touch finished'

rule link
  command = touch $out

build bad.o: bad
build slow.o: slow
build m.so: link bad.o slow.o
"""


def _running(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_a_failing_unit_stops_its_siblings(tmp_path, monkeypatch):
    """main.cpp failing in 0.3 s ends the build then: the other unit's compiler (and the
    process it started) is killed instead of running its 41 s, and the error is main.cpp's."""
    monkeypatch.setenv(compile_steps.SLOTS_ENV, "4")
    (tmp_path / "build.ninja").write_text(FAILFAST_NINJA)
    start = time.monotonic()
    with pytest.raises(compile_steps.StepError, match="undeclared name"):
        compile_steps.run_steps(tmp_path / "build.ninja", tmp_path / "cache")
    assert time.monotonic() - start < 20
    assert (tmp_path / "started").exists() and not (tmp_path / "finished").exists()
    assert _running("sleep 41.25") == []


def test_a_unit_queued_behind_a_failing_one_never_starts(tmp_path, monkeypatch):
    """One CPU slot, held by the unit that fails: the other unit stops while it waits."""
    monkeypatch.setenv(compile_steps.SLOTS_ENV, "1")
    (tmp_path / "build.ninja").write_text(FAILFAST_NINJA)
    real = compile_steps.run_command

    def bad_first(command, *args, **kwargs):
        while "41.25" in command and not (tmp_path / "bad_started").exists():
            time.sleep(0.01)
        return real(command, *args, **kwargs)

    monkeypatch.setattr(compile_steps, "run_command", bad_first)
    with pytest.raises(compile_steps.StepError, match="undeclared name"):
        compile_steps.run_steps(tmp_path / "build.ninja", tmp_path / "cache")
    assert (tmp_path / "bad_started").exists() and not (tmp_path / "started").exists()


def test_a_first_try_with_a_fallback_stops_no_sibling(tmp_path, monkeypatch):
    """The light-headers compile and the precompiled host pass may fail and fall back: such a
    failure (inside `recoverable()`) leaves the other unit running, and the build succeeds."""
    monkeypatch.setenv(compile_steps.SLOTS_ENV, "4")
    (tmp_path / "build.ninja").write_text(
        "rule cuda_compile\n  command = unused\n\nrule slow\n  command = sleep 1 && touch finished\n\n"
        "rule link\n  command = touch $out\n\nbuild cuda.o: cuda_compile\nbuild main.o: slow\n"
        "build m.so: link cuda.o main.o\n")

    def cuda_compile(step, log):
        try:
            with compile_steps.recoverable():
                compile_steps.run_command("exit 1", tmp_path, tmp_path / "cache", log)
        except compile_steps.StepError:
            compile_steps.run_command("touch cuda.o", tmp_path, tmp_path / "cache", log)
        return "fell back"

    notes = compile_steps.run_steps(tmp_path / "build.ninja", tmp_path / "cache",
                                    cuda_compile=cuda_compile)
    assert notes == ["fell back"]
    assert (tmp_path / "finished").exists() and (tmp_path / "m.so").exists()


HOST_FIRST_NINJA = """ninja_required_version = 1.3

rule compile
  command = echo host >> order && sleep 0.2 && echo 'main.cpp: error: undeclared name' >&2 && exit 1

rule cuda_compile
  command = echo cuda >> order && sleep 30.5 && touch cuda_finished

rule link
  command = touch $out

build cuda.o: cuda_compile cuda.cu
build main.o: compile main.cpp
build m.so: link main.o cuda.o
"""


def test_main_cpp_takes_its_slot_before_its_cuda_unit(tmp_path, monkeypatch):
    """One CPU slot and a main.cpp that is slow to ask for it (0.3 s before its command): the
    cuda unit still waits, main.cpp fails in 0.2 s, and the 30 s nvcc never starts (without
    the order, the cuda unit takes the free slot first and the failure waits behind it)."""
    monkeypatch.setenv(compile_steps.SLOTS_ENV, "1")
    (tmp_path / "build.ninja").write_text(HOST_FIRST_NINJA)

    def slow_host(step):
        if step["rule"] == "compile":
            time.sleep(0.3)

    start = time.monotonic()
    with pytest.raises(compile_steps.StepError, match="undeclared name"):
        compile_steps.run_steps(tmp_path / "build.ninja", tmp_path / "cache", slow_host)
    assert (tmp_path / "order").read_text().split() == ["host"]
    assert time.monotonic() - start < 20
    assert _running("sleep 30.5") == []


@pytest.mark.parametrize("host_fails", [True, False])
def test_the_cuda_unit_waits_for_main_cpp_even_with_free_slots(tmp_path, monkeypatch,
                                                               host_fails):
    """Four free slots: nvcc still starts only once main.cpp is done, so a main.cpp that
    fails costs no nvcc work; one that compiles is followed by the cuda unit."""
    monkeypatch.setenv(compile_steps.SLOTS_ENV, "4")
    ninja = HOST_FIRST_NINJA if host_fails else HOST_FIRST_NINJA.replace(
        " && echo 'main.cpp: error: undeclared name' >&2 && exit 1", "").replace(
        " && sleep 30.5", "")
    (tmp_path / "build.ninja").write_text(ninja)
    if host_fails:
        with pytest.raises(compile_steps.StepError, match="undeclared name"):
            compile_steps.run_steps(tmp_path / "build.ninja", tmp_path / "cache")
        assert (tmp_path / "order").read_text().split() == ["host"]
        assert _running("sleep 30.5") == []
    else:
        compile_steps.run_steps(tmp_path / "build.ninja", tmp_path / "cache")
        assert (tmp_path / "order").read_text().split() == ["host", "cuda"]
        assert (tmp_path / "m.so").exists()


@pytest.mark.parametrize("hold", [False, True])
def test_a_host_unit_waiting_for_another_builders_lock_lets_cuda_go(tmp_path, monkeypatch,
                                                                    hold):
    """main.cpp waiting for a lock another builder holds (a precompiled header being made)
    holds nothing back: the cuda unit takes the slot meanwhile, and the build succeeds;
    unless it holds its line (a main.cpp the binding check expects to fail): then the cuda
    unit still waits for it."""
    monkeypatch.setenv(compile_steps.SLOTS_ENV, "1")
    (tmp_path / "build.ninja").write_text(
        HOST_FIRST_NINJA.replace(" && sleep 0.2 && echo 'main.cpp: error: undeclared name' >&2"
                                 " && exit 1", "").replace(" && sleep 30.5", ""))
    lock_path = tmp_path / "pch.lock"
    held = open(lock_path, "w")  # noqa: SIM115 - released by the timer below
    fcntl.flock(held, fcntl.LOCK_EX)
    threading.Timer(0.5, held.close).start()

    def pch_wait(step):
        if step["rule"] == "compile":
            with open(lock_path, "w") as handle, compile_steps.holding_line(hold):
                compile_steps.wait_for_lock(handle)

    compile_steps.run_steps(tmp_path / "build.ninja", tmp_path / "cache", pch_wait)
    order = ["host", "cuda"] if hold else ["cuda", "host"]
    assert (tmp_path / "order").read_text().split() == order
    assert (tmp_path / "m.so").exists() and (tmp_path / "cuda_finished").exists()


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_run_steps_records_each_command(tmp_path):
    """`steps` gets one record per compiler run (the host unit, the link), with the wall and
    CPU seconds of its process tree (bench/build_breakdown.py sums them per phase)."""
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "main.cpp").write_text("int main() { return 0; }\n")
    (folder / "build.ninja").write_text(NINJA.replace("/tmp/a$:b/main.cpp", "main.cpp")
                                        .replace("-shared", ""))
    steps: list[dict] = []
    compile_steps.run_steps(folder / "build.ninja", tmp_path / "cache", steps=steps)
    assert [s["step"] for s in steps] == ["host", "link"]
    for s in steps:
        assert s["ok"] and s["seconds"] >= 0 and s["cpu_s"] >= 0 and s["wait_s"] >= 0
    assert (folder / "m.so").exists()
    # a failing command is recorded too, and nothing is recorded without a list
    steps.clear()
    with compile_steps.recording(steps), pytest.raises(compile_steps.StepError):
        compile_steps.run_command("exit 3", folder, tmp_path / "cache", [], step="host")
    assert [(s["step"], s["ok"]) for s in steps] == [("host", False)]
    compile_steps.run_command("true", folder, tmp_path / "cache", [])
    assert len(steps) == 1


def test_run_measured_counts_the_process_tree(tmp_path):
    """CPU time comes from wait4: a grandchild's work (sh -> sh -> loop) is counted."""
    code, out, err, wall, cpu = compile_steps.run_measured(
        "sh -c 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo done'", tmp_path,
        shell=True)
    assert code == 0 and out.strip() == "done" and err == ""
    assert cpu > 0 and wall > 0


@pytest.mark.parametrize("line, name", [
    ('gcc -D__CUDA_ARCH__=900 -E -x c++ "cuda.cu" -o "nvcc/cuda.cpp1.ii"', "cuda:preprocess"),
    ('cudafe++ --c++20 --gnu_version=120200 --module_id_file_name "x.module_id"', "cuda:cudafe"),
    ('"$CICC_PATH/cicc" --c++20 -arch compute_90 "nvcc/cuda.cpp1.ii"', "cuda:cicc"),
    ('ptxas -arch=sm_90 -m64 "nvcc/cuda.ptx" -o "nvcc/cuda.sm_90.cubin"', "cuda:ptxas"),
    ('fatbinary --create="nvcc/cuda.fatbin" -64', "cuda:fatbinary"),
    ('gcc -c -x c++ -fPIC "nvcc/cuda.cudafe1.cpp" -o "cuda.cuda.o"', "cuda:host-compile"),
])
def test_nvcc_phases_are_named(line, name):
    assert nvcc_split.phase_name(line) == name


@pytest.mark.parametrize("wait", [True, False])
def test_a_main_cpp_waits_for_the_prelude_header_another_builder_is_making(tmp_path,
                                                                           monkeypatch, wait):
    """Two builds of one prelude: the first makes its precompiled header (a slow compiler
    here), the second finds it being made and waits for it, then uses it ("waited"), making
    none itself; with the wait off it compiles plainly at once ("busy")."""
    from kernelharness.compilation import builder

    compiler = tmp_path / "slow-cxx"
    calls = tmp_path / "calls"
    compiler.write_text(f'#!/bin/sh\necho x >> "{calls}"\nsleep 1\n'
                        'for last; do :; done\necho pch > "$last"\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.delenv(compile_steps.SLOTS_ENV, raising=False)
    header = tmp_path / "prelude.h"
    header.write_text("#pragma once\n")
    ninja = tmp_path / "build.ninja"
    ninja.write_text("cflags = -O0 -DTORCH_EXTENSION_NAME=m\n")
    # the prelude was seen once before: its header is made on this (second) use
    assert builder._ensure_prelude_pch(header, ninja, tmp_path) == "prelude-pch:first-seen"
    notes: dict[str, str] = {}
    maker = threading.Thread(target=lambda: notes.update(
        maker=builder._ensure_prelude_pch(header, ninja, tmp_path)))
    maker.start()
    deadline = time.monotonic() + 10
    while not calls.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    notes["second"] = builder._ensure_prelude_pch(header, ninja, tmp_path, wait=wait)
    maker.join()
    assert notes["maker"] == "prelude-pch:built"
    assert notes["second"] == ("prelude-pch:waited" if wait else "prelude-pch:busy")
    assert calls.read_text().count("x") == 1  # one header made, by the first
    assert len(list((tmp_path / "prelude.h.gch").iterdir())) == 1
    assert builder._ensure_prelude_pch(header, ninja, tmp_path) == "prelude-pch:hit"


FAKE_CXX = """#!/bin/sh
# a stand-in compiler: the object is the module name it was given and the source's text
if [ "$1" = --version ]; then echo "fake-cxx 1.0"; exit 0; fi
echo call >> "$CALLS"
for a; do case "$a" in -DTORCH_EXTENSION_NAME=*) name="${a#*=}";; esac; done
while [ $# -gt 0 ]; do case "$1" in -c) src="$2"; shift;; -o) out="$2"; shift;; esac; shift; done
if grep -q BROKEN "$src"; then echo "$src:1:1: error: 'nope' was not declared" >&2; exit 1; fi
if grep -q STARVED "$src"; then
  echo "cc1plus: fatal error: error writing to /tmp/cc.s: No space left on device" >&2; exit 1
fi
{ echo "module $name"; cat "$src"; } > "$out"
"""

MAIN_CPP = "#include <torch/extension.h>\nint f();\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}\n"


def _host_step(tmp_path, folder_name: str, name: str, text: str, compiler: str | None = None,
               share: bool = True):
    """compile_host_object on main.cpp = `text` in its own build folder, as torch's ninja
    writes the command (default compiler: the stand-in `cxx` in tmp_path)."""
    from kernelharness.compilation import builder

    compiler = compiler or f"{tmp_path / 'cxx'} -MMD -MF main.o.d -fPIC"
    folder = tmp_path / folder_name
    folder.mkdir()
    (folder / "main.cpp").write_text(text)
    step = {"rule": "compile", "out": "main.o", "in": [str(folder / "main.cpp")],
            "command": f"{compiler} -DTORCH_EXTENSION_NAME={name} "
                       f"-c {folder / 'main.cpp'} -o main.o"}
    note = builder.compile_host_object(step, folder, tmp_path / "cache", [], name, text,
                                       share=share)
    return note, folder


def test_builds_share_one_main_cpp_object_under_their_own_names(tmp_path, monkeypatch):
    """The second build of the same main.cpp text and command compiles nothing: it takes the
    first one's object with its own module name in it, the object its own compile makes;
    another text compiles; a source naming its own path or a file beside it always
    compiles; with sharing off every build compiles."""
    from kernelharness.compilation import builder

    (tmp_path / "cxx").write_text(FAKE_CXX)
    (tmp_path / "cxx").chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.delenv(compile_steps.SLOTS_ENV, raising=False)
    a, b = "dp_" + "a" * 24, "dp_" + "b" * 24
    note, first = _host_step(tmp_path, "one", a, MAIN_CPP)
    assert note == "host-object:made"
    assert (first / "main.o").read_text() == f"module {a}\n{MAIN_CPP}"
    note, second = _host_step(tmp_path, "two", b, MAIN_CPP)
    assert note == "host-object:shared"
    assert (second / "main.o").read_text() == f"module {b}\n{MAIN_CPP}"
    assert calls.read_text().count("call") == 1
    assert _host_step(tmp_path, "three", b, MAIN_CPP + "int g();\n")[0] == "host-object:made"
    assert calls.read_text().count("call") == 2
    for k, own in enumerate(['#include "kernel.h"\n', "const char* p = __FILE__;\n",
                             ("const char* n = TORCH_EXTENSION_NAME_STR;\n#define X "
                              "TORCH_EXTENSION_NAME\n")]):
        assert not builder.host_object_shareable(MAIN_CPP + own)
        assert _host_step(tmp_path, f"own{k}", a, MAIN_CPP + own)[0] == ""
    assert builder.host_object_shareable(MAIN_CPP.replace(
        "<torch/extension.h>", '"/cache/preludes/0123abcd.h"'))  # the minimal prelude's
    before = calls.read_text().count("call")  # BuildOptions.share_host_objects off:
    assert _host_step(tmp_path, "off", b, MAIN_CPP, share=False)[0] == ""
    assert calls.read_text().count("call") == before + 1


def test_a_main_cpp_compiler_error_is_shared_with_the_next_build(tmp_path, monkeypatch):
    """A main.cpp that does not compile fails the next build of the same text at once, with
    the same error (which names the unit, not the first build's folder); the compiler runs
    once. A compiler that failed for want of disk is asked again."""
    (tmp_path / "cxx").write_text(FAKE_CXX)
    (tmp_path / "cxx").chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.delenv(compile_steps.SLOTS_ENV, raising=False)
    broken = MAIN_CPP + "// BROKEN\n"
    with pytest.raises(compile_steps.StepError, match="error: 'nope'"):
        _host_step(tmp_path, "one", "dp_" + "a" * 24, broken)
    with pytest.raises(compile_steps.StepError) as second:
        _host_step(tmp_path, "two", "dp_" + "b" * 24, broken)
    assert "main.cpp:1:1: error: 'nope'" in str(second.value)
    assert str(tmp_path / "one") not in str(second.value)  # the unit by its name, no folder
    assert calls.read_text().count("call") == 1
    # a compiler that could not write its output says nothing of the text: not shared
    starved = MAIN_CPP + "// STARVED\n"
    for k in range(2):
        with pytest.raises(compile_steps.StepError, match="No space left"):
            _host_step(tmp_path, f"starved{k}", "dp_" + "c" * 24, starved)
    assert calls.read_text().count("call") == 3


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_a_shared_main_cpp_object_is_byte_for_byte_its_own_compile(tmp_path, monkeypatch):
    """With a real compiler and pybind11: the object a build takes from another build's
    compile (its name written over the placeholder) is byte for byte the one its own
    compile of the same command makes."""
    import sysconfig

    from torch.utils import cpp_extension

    monkeypatch.delenv(compile_steps.SLOTS_ENV, raising=False)
    text = ("#include <pybind11/pybind11.h>\nint twice(int x) { return 2 * x; }\n"
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"twice\", &twice); }\n")
    include = os.path.join(cpp_extension._TORCH_PATH, "include")
    if not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("needs Python's headers")
    flags = f"-I{include} -I{sysconfig.get_paths()['include']} -fPIC -std=c++17"
    objects = {}
    for folder_name, name in (("one", "dp_" + "1" * 24), ("two", "dp_" + "2" * 24)):
        note, folder = _host_step(tmp_path, folder_name, name, text, f"c++ {flags}")
        objects[folder_name] = (folder / "main.o").read_bytes()
        assert note == ("host-object:made" if folder_name == "one" else "host-object:shared")
    own = tmp_path / "own"
    own.mkdir()
    (own / "main.cpp").write_text(text)
    subprocess.run(f"c++ {flags} -DTORCH_EXTENSION_NAME={'dp_' + '2' * 24} -c main.cpp "
                   "-o main.o", shell=True, cwd=own, check=True)
    assert objects["two"] == (own / "main.o").read_bytes()
    assert b"PyInit_dp_" + b"2" * 24 in objects["two"]
    assert b"ZZZZ" not in objects["two"]
