"""The previous edgeserve that `make bench` compares with ("vs previous"), built once per revision.

    python -m bench.baseline --rev auto|none|<git rev> --dir ~/.cache/edgeserve/baseline \
        --wheels ~/.cache/edgeserve/wheels/<backend>-<key> [--python python3]

prints the path of the baseline's `edgeserve` (nothing for `none`), building it first when it is
not there yet: DIR/<12-digit sha>/ holds `git archive <sha>` unpacked, REVISION (the sha and
subject) and a `.venv` with the cached llama-cpp-python wheel (the one `.venv` has) and
`pip install -e .`, so llama.cpp is never rebuilt; pip fetches only the revision's other pinned
dependencies. A later run with the same revision and wheel reuses it as it is.

`auto` is the newest commit of `main` (else `origin/main`) that is an ancestor of HEAD and whose
server (`edgeserve/`, `pyproject.toml`) differs from this working tree's: on a branch, where it
left main; on main with uncommitted changes, HEAD; on a clean main, the last commit before HEAD
that changed the server (a commit that touched only the docs, tests or bench is passed over,
since it would compare edgeserve with itself). Standard library only, like bench.build.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

AUTO = "auto"
NONE = "none"
MAIN_BRANCHES = ("main", "origin/main")
# What decides whether two revisions serve differently.
SERVER_PATHS = ("edgeserve", "pyproject.toml")
MAX_WALK = 500
REVISION = "REVISION"


def git(repo: Path, *args: str) -> str:
    """The output of a git command in `repo`, stripped; SystemExit with git's message on failure."""
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def has_commit(repo: Path, rev: str) -> bool:
    """Whether `rev` names a commit in `repo`."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
    )
    return proc.returncode == 0


def server_differs(repo: Path, sha: str) -> bool:
    """Whether the server of commit `sha` differs from the working tree's (tracked files)."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "diff", "--quiet", sha, "--", *SERVER_PATHS],
        capture_output=True,
    )
    if proc.returncode > 1:
        raise SystemExit(f"git diff {sha}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.returncode == 1


def auto_baseline(repo: Path) -> str:
    """The `auto` rule (see the module docstring): a full sha."""
    branch = next((b for b in MAIN_BRANCHES if has_commit(repo, b)), None)
    if branch is None:
        raise SystemExit("no main branch to compare with: set BASELINE=<git rev> or BASELINE=none")
    fork = git(repo, "merge-base", branch, "HEAD")
    walk = git(repo, "rev-list", "--first-parent", f"--max-count={MAX_WALK}", fork).split()
    for sha in walk:
        if server_differs(repo, sha):
            return sha
    raise SystemExit(
        f"none of the last {len(walk)} commits of {branch} serves differently from this tree: "
        "set BASELINE=<git rev> or BASELINE=none"
    )


def resolve(repo: Path, rev: str) -> str | None:
    """The full sha the bench compares with (None for `none`)."""
    if rev == NONE:
        return None
    if rev == AUTO:
        return auto_baseline(repo)
    if not has_commit(repo, rev):
        raise SystemExit(f"BASELINE={rev} is not a commit of this repository")
    return git(repo, "rev-parse", f"{rev}^{{commit}}")


def unpack(repo: Path, sha: str, dest: Path) -> None:
    """`git archive sha` unpacked into `dest` (made through a temporary folder beside it)."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", sha], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            tar.extractall(tmp, filter="data")
        else:
            tar.extractall(tmp)
    subject = git(repo, "log", "-1", "--format=%s", sha)
    (tmp / REVISION).write_text(f"{sha} {subject}\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def build(repo: Path, sha: str, root: Path, wheels: Path, python: str) -> Path:
    """Make sure ROOT/<sha12>/.venv/bin/edgeserve runs revision `sha` with the wheel in
    `wheels`; return its path."""
    dest = root.expanduser() / sha[:12]
    venv = dest / ".venv"
    exe = venv / "bin" / "edgeserve"
    marker = venv / f".installed-{wheels.name}"
    if marker.is_file() and os.access(exe, os.X_OK):
        print(f"baseline: reusing {dest}", file=sys.stderr)
        return exe
    found = sorted(wheels.glob("llama_cpp_python-*.whl"))
    if not found:
        raise SystemExit(f"no llama-cpp-python wheel in {wheels}: run `make install` first")
    print(f"baseline: building {sha[:12]} into {dest} (once)", file=sys.stderr)
    if not (dest / REVISION).is_file():
        unpack(repo, sha, dest)
    if not (venv / "bin" / "python").is_file():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--force-reinstall", "--no-deps", str(found[-1])], check=True)
    # --only-binary: a revision that pins another llama-cpp-python fails here at once rather
    # than compiling llama.cpp (the comparison would no longer be of edgeserve alone).
    proc = subprocess.run([*pip, "--only-binary", "llama-cpp-python", "-e", str(dest)])
    if proc.returncode != 0:
        raise SystemExit(f"baseline: pip install -e {dest} failed (does {sha[:12]} pin the "
                         f"llama-cpp-python of {found[-1].name}?)")  # fmt: skip
    for old in venv.glob(".installed-*"):
        old.unlink()
    marker.touch()
    return exe


def describe(edgeserve: Path) -> str | None:
    """The REVISION line of a baseline built here ("<sha> <subject>"), None for another path."""
    try:
        return (edgeserve.parents[2] / REVISION).read_text().strip() or None
    except (OSError, IndexError):
        return None


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rev", default=AUTO, help=f"{AUTO}, {NONE} or a git revision")
    parser.add_argument("--dir", type=Path, default=Path("~/.cache/edgeserve/baseline"))
    parser.add_argument("--wheels", type=Path, required=True, help="the llama-cpp-python wheel")
    parser.add_argument("--python", default="python3", help="the interpreter of the venv")
    parser.add_argument("--repo", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    sha = resolve(args.repo, args.rev)
    if sha is None:
        return
    print(f"baseline: {args.rev} is {git(args.repo, 'log', '-1', '--format=%h %s', sha)}",
          file=sys.stderr)  # fmt: skip
    print(build(args.repo, sha, args.dir, args.wheels.expanduser(), args.python))


if __name__ == "__main__":
    main()
