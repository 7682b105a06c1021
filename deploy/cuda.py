"""Find (or fetch) what a CUDA build of llama-cpp-python needs, and print its CMake arguments.

`python3 deploy/cuda.py cmake-args --arch 87 --toolkits DIR --record WHEELS` is run by
`make install-cuda` before it compiles. It looks for a CUDA compiler, in order: `$CUDACXX`,
`nvcc` on PATH, `$CUDA_HOME`/`$CUDA_PATH`, `/usr/local/cuda`, `/opt/cuda`. With none, NVIDIA's
toolkit wheels (pinned below) are installed into DIR, a build-only folder, never the serving
venv. cuBLAS comes from the toolkit where it has it, else from NVIDIA's cuBLAS wheel in DIR; then
the serving venv also needs that wheel to run the build, which is written to
WHEELS/requirements.txt for `make install` (edgeserve loads it from there before llama.cpp).
Without the CUDA driver library (`libcuda.so`: a GPU box has it; the toolkit wheels ship no stub),
the build leaves out CUDA's virtual memory management (`GGML_CUDA_NO_VMM`): ggml's memory pool
then grows by separate allocations instead of one reserved range. What was used is written to
WHEELS/toolkit.txt.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# One CUDA 13.0 toolkit from the package index, when no compiler is installed.
TOOLKIT_WHEELS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
)
# cuBLAS for a toolkit without it, by CUDA major version: the oldest line of each major, whose
# headers every later toolkit of that major compiles.
CUBLAS_WHEELS = {"13": "nvidia-cublas==13.0.2.14", "12": "nvidia-cublas-cu12==12.1.3.1"}
# The CUDA runtime of the wheels, when the loader cannot find the toolkit's own.
CUDART_WHEELS = {"13": "nvidia-cuda-runtime==13.0.96", "12": "nvidia-cuda-runtime-cu12==12.1.105"}
# Where each major's wheels put their files (inside the install folder).
WHEEL_TREES = {"13": ("nvidia/cu13",), "12": ("nvidia/cublas", "nvidia/cuda_runtime")}
STANDARD_ROOTS = ("/usr/local/cuda", "/opt/cuda")


@dataclass(frozen=True)
class Toolkit:
    """A CUDA compiler and where its headers and libraries are."""

    nvcc: Path
    version: str
    root: Path

    @property
    def major(self) -> str:
        return self.version.split(".")[0]

    def include_dirs(self) -> list[Path]:
        return [self.root / "include", *sorted(self.root.glob("targets/*/include"))]

    def lib_dirs(self) -> list[Path]:
        found = [self.root / "lib64", self.root / "lib", *sorted(self.root.glob("targets/*/lib"))]
        return [d for d in found if d.is_dir()]


def toolkit_of(nvcc: Path) -> Toolkit:
    """The toolkit `nvcc` belongs to: its release (`--version`) and its own top folder, which
    `--dryrun` prints (nvcc on PATH is often a link or a wrapper script)."""
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True)
    release = re.search(r"release (\d+\.\d+)", out.stdout)
    dry = [str(nvcc), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull]
    top = re.search(
        r"^#\$ TOP=(.+)$", subprocess.run(dry, capture_output=True, text=True).stderr, re.MULTILINE
    )
    if release is None or top is None:
        raise SystemExit(f"cuda: cannot read the release and folder of {nvcc}")
    root = Path(top.group(1)).resolve()
    return Toolkit(root / "bin" / "nvcc", release.group(1), root)


def find_nvcc(env: dict[str, str]) -> Path | None:
    """The first CUDA compiler in the documented order, or None."""
    candidates: list[str | None] = [env.get("CUDACXX"), shutil.which("nvcc", path=env.get("PATH"))]
    candidates += [
        str(Path(env[k]) / "bin" / "nvcc") for k in ("CUDA_HOME", "CUDA_PATH") if k in env
    ]
    candidates += [f"{root}/bin/nvcc" for root in STANDARD_ROOTS]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def pip_install(requirements: tuple[str, ...], target: Path) -> Path:
    """Install wheels (no dependencies) into `target` once; `target` is returned."""
    marker = target / ".complete"
    if not marker.exists():
        shutil.rmtree(target, ignore_errors=True)
        print(f"cuda: installing {' '.join(requirements)} into {target}", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
             *requirements],
            check=True,
        )  # fmt: skip
        marker.touch()
    return target


def wheel_toolkit(toolkits: Path) -> Toolkit:
    """The pinned toolkit wheels, installed into `toolkits`."""
    folder = pip_install(TOOLKIT_WHEELS, toolkits / "toolkit-13.0")
    return toolkit_of(folder / WHEEL_TREES["13"][0] / "bin" / "nvcc")


def first_file(dirs: list[Path], pattern: str) -> Path | None:
    """The first file matching `pattern` in `dirs`, in order."""
    for folder in dirs:
        hits = sorted(folder.glob(pattern))
        if hits:
            return hits[0]
    return None


def loader_finds(soname: str) -> Path | None:
    """Where the dynamic loader's cache (`ldconfig -p`) has `soname`, if it has it."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        listing = subprocess.run(
            [ldconfig, "-p"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return None
    match = re.search(rf"^\s*{re.escape(soname)} \(.*\) => (\S+)$", listing, re.MULTILINE)
    return Path(match.group(1)) if match else None


def driver_library(toolkit: Toolkit) -> Path | None:
    """libcuda.so from the toolkit's stubs or the driver, where either exists."""
    stubs = [d / "stubs" for d in toolkit.lib_dirs()]
    return first_file(stubs, "libcuda.so") or loader_finds("libcuda.so.1")


def cmake_args(arch: str, toolkits: Path, record: Path, env: dict[str, str]) -> list[str]:
    """The CMake arguments of a CUDA build; also writes record/requirements.txt and toolkit.txt."""
    nvcc = find_nvcc(env)
    toolkit = toolkit_of(nvcc) if nvcc else wheel_toolkit(toolkits)
    args = [f"-DCMAKE_CUDA_COMPILER={toolkit.nvcc}", f"-DCUDAToolkit_ROOT={toolkit.root}"]
    if arch:
        args.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    notes = [f"nvcc {toolkit.version}: {toolkit.nvcc}"]
    requirements: list[str] = []
    if first_file(toolkit.include_dirs(), "cublas_v2.h") is None:
        wheel = CUBLAS_WHEELS.get(toolkit.major)
        if wheel is None:
            raise SystemExit(
                f"cuda: no cuBLAS in {toolkit.root} and no cuBLAS wheel for CUDA {toolkit.version}"
            )
        folder = pip_install((wheel,), toolkits / wheel.replace("==", "-"))
        trees = [folder / tree for tree in WHEEL_TREES[toolkit.major]]
        include = first_file([t / "include" for t in trees], "cublas_v2.h")
        libs = {
            name: first_file([t / "lib" for t in trees], f"lib{name}.so*")
            for name in ("cublas", "cublasLt")
        }
        if include is None or None in libs.values():
            raise SystemExit(f"cuda: {wheel} in {folder} lacks cuBLAS's header or libraries")
        args += [f"-DCUDA_{name}_LIBRARY={path}" for name, path in libs.items()]
        args.append(f"-DCMAKE_CUDA_FLAGS=-I{include.parent}")
        requirements.append(wheel)
        notes.append(f"cuBLAS: {wheel} (also installed into the serving venv)")
    else:
        notes.append(f"cuBLAS: {toolkit.root}")
    cudart = f"libcudart.so.{toolkit.major}"
    if loader_finds(cudart) is None and toolkit.major in CUDART_WHEELS:
        requirements.append(CUDART_WHEELS[toolkit.major])
        notes.append(
            f"runtime: {cudart} is not in the loader's cache: {requirements[-1]} in the venv"
        )
    driver = driver_library(toolkit)
    if driver is None:
        args.append("-DGGML_CUDA_NO_VMM=ON")
        notes.append("driver: no libcuda.so at build time, so GGML_CUDA_NO_VMM=ON")
    else:
        notes.append(f"driver: {driver} (CUDA VMM on)")
    if any(" " in arg for arg in args):
        raise SystemExit(f"cuda: paths with spaces cannot pass through CMAKE_ARGS: {args}")
    record.mkdir(parents=True, exist_ok=True)
    (record / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
    (record / "toolkit.txt").write_text("".join(f"{n}\n" for n in notes))
    return args


def main() -> None:
    """`cmake-args`: print the CMake arguments of a CUDA build (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="deploy/cuda.py", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    args_cmd = sub.add_parser("cmake-args", help="print the CMake arguments of a CUDA build")
    args_cmd.add_argument(
        "--arch", default="", help="CMAKE_CUDA_ARCHITECTURES (empty: llama.cpp's list)"
    )
    args_cmd.add_argument(
        "--toolkits", type=Path, required=True, help="build-only folder for wheels"
    )
    args_cmd.add_argument("--record", type=Path, required=True, help="the wheel cache folder")
    opts = parser.parse_args()
    for note_line in cmake_args(opts.arch, opts.toolkits, opts.record, dict(os.environ)):
        print(note_line)


if __name__ == "__main__":
    main()
