"""Every command the README and docs/ show still works: the scripts and modules they run exist, and
every --flag they pass is one that command accepts (its --help for the three CLIs and the module
command, the bench script's own source for benchmarks). A --flag named in prose must exist too."""

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
# flags of other tools the docs mention: accelerate launch's, ruff's, hf upload's, pytest's, and one named as
# not built
OTHER_TOOLS = {
    "--num_processes",
    "--multi_gpu",
    "--check",
    "--exclude",
    "--delete",
    "--private",
    "--compile",
    "--override-ini",
}
COMMAND = re.compile(r"python(?:3)? (-m vits_trainer[\w.]*|[\w./-]+\.py)((?: +[^\s`|;&#)]+)*)")
FILE = re.compile(r"(?<![\w/.])((?:vits_trainer|tests|bench|docs)/[\w/.-]+\.(?:py|md))")


def _code(text: str) -> list[str]:
    """Fenced blocks' lines (backslash continuations joined) and inline code spans."""
    parts = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        parts += block.replace("\\\n", " ").split("\n")
    prose = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    parts += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return parts


def _commands() -> list[tuple[str, str, str]]:
    """(doc, what runs: a script path or -m module, its arguments) for every python command shown."""
    found = []
    for doc in DOCS:
        for line in _code(doc.read_text(encoding="utf-8")):
            for target, args in COMMAND.findall(line):
                found.append((doc.name, target, args))
    return found


@cache
def _accepted(target: str, subcommand: str) -> frozenset[str]:
    """The flags `target` accepts: its --help for the CLIs and modules, its source for a bench script."""
    if target.startswith("bench/"):
        return frozenset(re.findall(r"\"(--[a-z][a-z0-9_-]*)\"", (ROOT / target).read_text()))
    head = ["-m", target[3:]] if target.startswith("-m ") else [str(ROOT / target)]
    sub = [subcommand] if subcommand else []
    out = subprocess.run(
        [sys.executable, *head, *sub, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, (target, out.stderr[-2000:])
    return frozenset(FLAG.findall(out.stdout))


def test_the_docs_show_commands():
    targets = {target for _, target, _ in _commands()}
    assert {"train_vits.py", "prepare_data.py", "train_feedback.py"} <= targets, targets


@pytest.mark.parametrize("doc,target,args", _commands(), ids=lambda v: str(v)[:60])
def test_every_documented_command_and_flag_exists(doc, target, args):
    if target.startswith("-m "):
        module = target[3:]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"{doc}: no module {module}"
    else:
        assert (ROOT / target).is_file(), f"{doc}: no script {target}"
    words = args.split()
    subcommand = words[0] if words and target.startswith("-m ") and not words[0].startswith("-") else ""
    accepted = _accepted(target, subcommand)
    unknown = sorted(set(FLAG.findall(args)) - accepted)
    assert not unknown, f"{doc}: python {target} does not accept {unknown}"


def test_every_flag_named_in_prose_exists_somewhere():
    known = set(OTHER_TOOLS)
    for target in ("train_vits.py", "prepare_data.py", "train_feedback.py"):
        known |= _accepted(target, "")
    for _, _target, args in _commands():
        known |= set(FLAG.findall(args))  # checked against their command above
    unknown = {}
    for doc in DOCS:
        for flag in FLAG.findall(doc.read_text(encoding="utf-8")):
            if flag not in known:
                unknown.setdefault(flag, doc.name)
    assert not unknown, f"flags no command accepts: {unknown}"


def test_every_file_the_docs_name_exists():
    missing = [
        (doc.name, path)
        for doc in DOCS
        for path in FILE.findall(doc.read_text(encoding="utf-8"))
        if not (ROOT / path).is_file()
    ]
    assert not missing, missing


def test_every_link_between_the_docs_resolves():
    broken = [
        (doc.name, target)
        for doc in DOCS
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8"))
        if not target.startswith(("http://", "https://")) and not (doc.parent / target).exists()
    ]
    assert not broken, broken


def _package(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def test_every_requirement_is_explained_in_the_docs():
    """requirements.txt and docs/development.md's "Dependencies, and why" name the same packages: each
    requirement is named there, and each package that section gives a bullet of its own is required."""
    required = {
        _package(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0])
        for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith(("#", "-"))
    }
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    section = text.split("## Dependencies, and why", 1)[1].split("\n## ", 1)[0]
    named = {_package(word) for word in re.findall(r"[A-Za-z][\w.-]*", section)}
    assert required - named == set(), f"requirements.txt packages the docs do not explain: {required - named}"
    bullets = {_package(name) for name in re.findall(r"^- \*\*([\w.-]+)\*\*", section, flags=re.M)}
    assert bullets - required == set(), (
        f"packages the docs explain but requirements.txt lacks: {bullets - required}"
    )


def test_every_hf_upload_shown_leaves_out_the_files_naming_this_machines_folders():
    """An upload by hand (a feedback version, a failed push) must leave out what --push_to_hub leaves out:
    the export marker holds this machine's absolute checkpoint path."""
    from vits_trainer.training.hub_push import NOT_UPLOADED

    command = re.compile(r"hf upload [\w.-]+/[\w.-]+ ")  # a repo and a folder: a command to run
    shown = [part for doc in DOCS for part in _code(doc.read_text(encoding="utf-8")) if command.search(part)]
    assert len(shown) >= 2, shown  # the failed push's and the feedback version's
    for part in shown:
        assert all(f"--exclude {name}" in part for name in NOT_UPLOADED), part
