"""What this proves: provenance records commit, dirty flag, torch / Python versions, threads, machine, wall time and
the exact command line; a dirty tree is said in the markdown line, and a command's own outputs (under results/ or
runs/, or declared) never make it dirty; outside a git checkout the commit is None."""
import json
import re
import shutil
import subprocess

import pytest
import torch

from r3.runs.provenance import earlier_segments, git_state, markdown_line, provenance, stamp

FIELDS = ["commit", "dirty", "torch", "python", "threads", "platform", "machine", "cpu_count", "started", "finished",
          "wall_s", "argv", "command"]


def git(repo, *args):
    """git in a scratch repository, as a committer named t."""
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_fields(tmp_path):
    p = provenance(["train.py", "--r3", "--out", "a b"], t0=0.0)
    assert set(FIELDS) <= set(p)
    assert p["torch"] == torch.__version__ and p["threads"] == torch.get_num_threads() and p["wall_s"] > 0
    assert p["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and p["cpu"]
    assert p["command"].endswith("train.py --r3 --out 'a b'") and p["argv"][1] == "--r3"
    if p["commit"] is not None:  # this checkout
        assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and isinstance(p["dirty"], bool)
    written = stamp(str(tmp_path / "run"), ["x"])
    assert json.loads((tmp_path / "run" / "provenance.json").read_text())["command"] == written["command"]
    assert written["wall_s"] is None


def test_outside_git(tmp_path):
    p = provenance([], repo=str(tmp_path))
    assert p["commit"] is None and p["dirty"] is None
    assert "not a git checkout" in markdown_line(p)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_dirty_tree_is_said(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "f.py").write_text("x = 1\n")
    git(tmp_path, "add", "f.py")
    git(tmp_path, "commit", "-qm", "c")
    clean = provenance(["train.py"], t0=0.0, repo=str(tmp_path))
    assert clean["dirty"] is False and "dirty" not in markdown_line(clean)
    assert f"`{clean['commit'][:10]}`" in markdown_line(clean) and "`python" in markdown_line(clean)
    (tmp_path / "out.json").write_text("{}")
    assert provenance([], repo=str(tmp_path))["dirty"] is False  # an untracked output is not code
    (tmp_path / "g.py").write_text("y = 1\n")
    assert provenance([], repo=str(tmp_path))["changed"] == ["g.py"]  # untracked code is
    (tmp_path / "g.py").unlink()
    (tmp_path / "f.py").write_text("x = 2\n")
    dirty = provenance(["train.py"], repo=str(tmp_path))
    assert dirty["dirty"] is True and dirty["changed"] == ["f.py"] and "dirty tree" in markdown_line(dirty)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_commands_own_outputs_never_make_its_tree_dirty(tmp_path):
    """The bug: a command that wrote results/a/first.json, then stamped results/a/second.json, recorded the second
    as made from a dirty tree (its own first output was a changed tracked file)."""
    git(tmp_path, "init", "-q")
    (tmp_path / "f.py").write_text("x = 1\n")
    (tmp_path / "results" / "a").mkdir(parents=True)
    (tmp_path / "results" / "a" / "first.json").write_text("{}")
    (tmp_path / "out.txt").write_text("old\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "c")
    (tmp_path / "results" / "a" / "first.json").write_text('{"kl": 1}')  # the command's first output
    (tmp_path / "results" / "a" / "second.json").write_text("{}")
    assert provenance([], repo=str(tmp_path))["dirty"] is False
    (tmp_path / "out.txt").write_text("new\n")  # a tracked file outside results/: an output only when declared
    assert provenance([], repo=str(tmp_path))["changed"] == ["out.txt"]
    assert provenance([], repo=str(tmp_path), outputs=[str(tmp_path / "out.txt")])["dirty"] is False
    (tmp_path / "f.py").write_text("x = 2\n")  # code still counts
    assert provenance([], repo=str(tmp_path), outputs=[str(tmp_path / "out.txt")])["changed"] == ["f.py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_run_keeps_the_commit_it_started_at_and_lists_earlier_processes(tmp_path):
    """The bug: train.py re-read the checkout for its end stamp, so a run whose checkout moved on while it ran (a
    grid in a worktree that was updated) recorded the new commit, not the code it had imported."""
    git(tmp_path, "init", "-q")
    (tmp_path / "f.py").write_text("x = 1\n")
    git(tmp_path, "add", "f.py")
    git(tmp_path, "commit", "-qm", "c1")
    run = str(tmp_path / "results" / "run")
    assert earlier_segments(run) == []  # nothing ran here yet
    start = stamp(run, ["train.py"], repo=str(tmp_path))  # a first process starts, and is killed
    (tmp_path / "f.py").write_text("x = 2\n")
    git(tmp_path, "commit", "-qam", "c2")
    code = git_state(str(tmp_path))  # the second process (a resume) starts at c2
    assert code["commit"] != start["commit"]
    segments = earlier_segments(run)
    assert segments == [dict(commit=start["commit"], dirty=False, started=start["finished"], finished=None,
                             cpu=start["cpu"])] and start["cpu"]
    second = stamp(run, ["train.py"], repo=str(tmp_path), git=code, segments=segments)
    (tmp_path / "f.py").write_text("x = 3\n")
    git(tmp_path, "commit", "-qam", "c3")  # the checkout moves on mid-run
    end = stamp(run, ["train.py"], 0.0, repo=str(tmp_path), git=second, segments=second["segments"])
    assert end["commit"] == code["commit"] != git_state(str(tmp_path))["commit"]
    assert [s["commit"] for s in end["segments"]] == [start["commit"]] and end["wall_s"] > 0
    later = earlier_segments(run)  # a third process would list both, the second with its start and end
    assert [s["commit"] for s in later] == [start["commit"], code["commit"]]
    assert later[1]["started"] == end["started"] and later[1]["finished"] == end["finished"]
    (tmp_path / "results" / "run" / "provenance.json").write_text("{not json")
    assert earlier_segments(run) == []  # an unreadable stamp is no history, not a crash
