"""README.md stays at most 20,000 bytes; every relative link in README.md and docs/*.md resolves (file and anchor);
tables the docs quote from results files are verbatim; the README's figures for its main job are those of the
committed results/quickstart.json (which CI remakes: experiments/reproduce.py)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (word characters, '-' and ' ' kept), each
    space a '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, seen = set(), {}
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text(encoding="utf-8")))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: are not relative


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken(path: Path) -> list[str]:
    bad = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no file {rel(dest)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {rel(dest)}")
    return bad


def test_readme_is_at_most_20000_bytes():
    size = (ROOT / "README.md").stat().st_size
    assert size <= 20_000, f"README.md is {size} bytes; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken(page) == []


def test_the_docs_exist_and_the_readme_links_every_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 5
    assert [p.name for p in pages if p.resolve() not in linked] == []


def test_the_checker_catches_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "b.md").write_text("# A heading: with `code`, punctuation & more\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#a-heading-with-code-punctuation--more) [gone](c.md) [no](b.md#nope) "
                    "`[in code](d.md)` [web](https://example.com/x)\n```\n[fenced](e.md)\n```\n")
    assert [b.split(":")[0] for b in broken(page)] == ["c.md", "b.md#nope"]


def tables(text: str) -> list[list[str]]:
    """The markdown tables of a text, each as its list of lines."""
    out, cur = [], []
    for line in text.split("\n") + [""]:
        if line.startswith("|"):
            cur.append(line.rstrip())
        elif cur:
            out, cur = out + [cur], []
    return out


def test_tables_quoted_from_results_files_are_verbatim():
    """A docs table whose header row is that of a table in a committed results/**/*.md file must be one of those
    tables, line for line; the mismatch tables must be what experiments.mismatch.table renders from the committed
    results/mismatch_table.json."""
    import json

    from experiments.mismatch.table import table
    sources: dict[str, list[list[str]]] = {}
    for f in sorted((ROOT / "results").rglob("*.md")):
        for t in tables(f.read_text(encoding="utf-8")):
            sources.setdefault(t[0], []).append(t)
    quoted = 0
    for page in PAGES:
        for t in tables(page.read_text(encoding="utf-8")):
            if t[0] in sources:
                quoted += 1
                assert t in sources[t[0]], f"{rel(page)}: table {t[0][:60]}... differs from its results file"
    assert quoted >= 8
    committed = json.loads((ROOT / "results" / "mismatch_table.json").read_text())["results"]
    results_page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for dtype in ("bf16", "fp8"):
        rendered = [line for line in table([r for r in committed if r["dtype"] == dtype], dtype).split("\n")
                    if line.startswith("|")]
        assert "\n".join(rendered) in results_page, f"docs/results.md: the {dtype} mismatch table is not committed"


def test_the_readme_quotes_the_measured_quickstart():
    import json
    q = json.loads((ROOT / "results" / "quickstart.json").read_text())
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"reward climbs from {q['reward_first']:.3f} to {q['reward_last']:.3f}" in text
    assert f"entropy falls from {q['entropy_first']:.2f} to {q['entropy_last']:.2f} nats" in text
    held = [f"{h['accuracy']:.3f} ({h['accuracy_greedy']:.3f})" for h in q["heldout"]]
    steps = [h["step"] for h in q["heldout"]]
    assert steps == [50, 100, 150, 200] and q["steps"] == 200
    assert (f"reads {held[0]} at step 50, {held[1]} at 100, {held[2]} at 150 and {held[3]} at the end") in text


def test_the_readme_quotes_the_exploration():
    """The README's sentence on the exploration before round 5 says what the committed results/regime/grid.json holds:
    its run count, no replay's falls at the strongest position under both updates, R3's over all its runs, and the
    strongest position's test."""
    import json

    from experiments.regime import design
    g = json.loads((ROOT / "results" / "regime" / "grid.json").read_text())
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    cells, top = g["cells"], design.STRONGEST
    done = sum(n for n, _ in g["progress"].values())
    r3 = [c for c in cells if c.split("/")[1] == "r3"]
    r3_falls, r3_n = (sum(cells[c][k] for c in r3) for k in ("collapsed", "n"))
    none, clip = cells[f"{top}/none/n4"], cells[f"{top}-clip/none/n4"]
    row = next(r for r in g["answer"]["positions"] if r["position"] == top)
    assert f"moved the toy along the dial ({done} runs of {g['steps']} steps)" in text
    assert (f"without replay RL fell on {none['collapsed']} of {none['n']} seeds at `{top}` and on "
            f"{clip['collapsed']} of {clip['n']} at `{top}-clip`") in text
    assert f"with R3 on {'none' if r3_falls == 0 else r3_falls} of {r3_n} runs anywhere" in text
    assert f"(Fisher p {row['p']:.2g} at `{top}`, Holm {row['p_holm']:.2g})" in text


def test_the_regime_page_summarises_the_grid():
    """docs/regime.md's summary of the exploration (the README's headline before round 5) says what the committed
    results/regime/grid.json holds (which CI remakes from the committed records): how far the grid is, every collapse
    count it quotes, the test at the strongest position and the kl trends' ranges; 'only at the strongest position'
    only while no weaker position fell."""
    import json

    from experiments.regime import design
    g = json.loads((ROOT / "results" / "regime" / "grid.json").read_text())
    text = " ".join((ROOT / "docs" / "regime.md").read_text(encoding="utf-8").split())
    cells, top, weak = g["cells"], design.STRONGEST, [p for p in design.POSITIONS if p != design.STRONGEST]
    count = lambda n: "none" if n == 0 else str(n)  # noqa: E731
    done, total = sum(n for n, _ in g["progress"].values()), sum(m for _, m in g["progress"].values())
    if g["complete"]["1"] and g["complete"]["2"]:
        assert f"tiers 1 and 2 are complete ({done} runs, seeds 0-{max(design.SEEDS)})" in text
    elif g["complete"]["1"]:
        assert "tier 1 is complete" in text
    else:
        tier1 = design.tier_cells(g["paper_matched"], deep=False, walk=False)[1]
        seeds = [s for s in design.SEEDS if all(str(s) in cells[c]["runs"] for c in tier1)]
        assert f"{done} of {total} runs, tier 1 on seeds 0-{max(seeds)} of 0-{max(design.SEEDS)}" in text
    none, r2, oracle = cells[f"{top}/none/n4"], cells[f"{top}/r2/n4"], cells["oracle/none/n4"]
    weak_falls, weak_n = (sum(cells[f"{p}/none/n4"][k] for p in weak) for k in ("collapsed", "n"))
    r3_falls, r3_n = (sum(cells[f"{p}/r3/n4"][k] for p in design.POSITIONS) for k in ("collapsed", "n"))
    assert f"on {none['collapsed']} of {none['n']} seeds at `{top}`" in text
    assert f"on {count(weak_falls)} of {weak_n} at the four weaker ones" in text
    assert f"with R3 on {count(r3_falls)} of {r3_n} anywhere" in text
    assert f"fell on {r2['collapsed']} of {r2['n']} at `{top}`; the fp32 oracle on {oracle['collapsed']} of " \
           f"{oracle['n']}" in text
    assert ("fell only at the strongest position" in text) == (weak_falls == 0)
    row = next(r for r in g["answer"]["positions"] if r["position"] == top)
    assert f"Fisher p {row['p']:.2g} (Holm over the five positions: {row['p_holm']:.2g})" in text
    n1 = [c for c in cells if c.endswith("/n1")]
    falls, runs = (sum(cells[c][k] for c in n1) for k in ("collapsed", "n"))
    if runs:  # tier 2's sentence, once it has runs
        said = "no run fell in either arm" if falls == 0 else f"{falls} of {runs} runs fell"
        assert f"at 1 mini-step (no drift between sampling and the update) {said} at `{top}` or " \
               f"`{g['paper_matched']}` ({runs} runs" in text
        cn, cr = cells[f"{top}-clip/none/n4"], cells[f"{top}-clip/r3/n4"]
        p = next(t["p"] for t in g["tests"] if (t["a"], t["b"], t["metric"]) == (f"{top}-clip/none/n4",
                                                                                 f"{top}-clip/r3/n4", "collapsed"))
        assert f"no replay fell on {cn['collapsed']} of {cn['n']} seeds at `{top}-clip`" in text
        assert f"R3 on {count(cr['collapsed'])} of {cr['n']} (Fisher p {p:.2g}, uncorrected" in text
    trend = lambda cs: [r["kl_trend"] for c in cs for r in cells[c]["runs"].values()]  # noqa: E731
    for cs in ([f"{p}/none/n4" for p in weak], [f"{top}/none/n4"], [f"{p}/r3/n4" for p in design.POSITIONS]):
        assert f"({min(trend(cs)):+.2f} to {max(trend(cs)):+.2f})" in text, cs


def test_the_regime_page_quotes_the_grid_at_each_position():
    """docs/regime.md's line of numbers per dial position (4 mini-steps, none against R3), and per tier-2 pair once
    two seeds have finished both its arms, is what the committed results/regime/grid.json holds: flip rates, collapse
    counts, Fisher p, held-out area with the paired effect, its interval and p, drawdown and kl trend means."""
    import json
    import statistics

    from experiments.regime import design
    g = json.loads((ROOT / "results" / "regime" / "grid.json").read_text())
    text = " ".join((ROOT / "docs" / "regime.md").read_text(encoding="utf-8").split())
    tests = {(t["a"], t["b"], t["metric"]): t for t in g["tests"]}
    st = design.STRONGEST
    pm = g["paper_matched"]
    said = {pm: ", the paper-matched position", st: ", the strongest"}
    pairs = [(p, "n4", f"**`{p}`**" + said.get(p, "")) for p in design.POSITIONS]
    pairs += [(p, "n1", f"**`{p}`, 1 mini-step**") for p in dict.fromkeys((st, pm))]
    pairs += [(f"{st}-clip", "n4", f"**`{st}-clip`, the clipped update**")]
    for p, k, head in pairs:
        n, r, s = g["cells"][f"{p}/none/{k}"], g["cells"][f"{p}/r3/{k}"], g["settings"][p.split("-")[0]]
        tc, ta, td = (tests.get((f"{p}/none/{k}", f"{p}/r3/{k}", x)) for x in ("collapsed", "heldout_area",
                                                                                "max_drawdown"))
        if (k == "n1" or "-" in p) and (ta is None or ta["lo"] is None):
            continue  # a tier-2 pair: held once two seeds have finished both its arms
        m = lambda c, key: statistics.fmean(x[key] for x in c["runs"].values())  # noqa: E731
        line = (f"({100 * s['router_flip_rate']:.1f} % of routers, {100 * s['token_flip_rate']:.1f} % of tokens "
                f"flipped at the start): no replay fell on {n['collapsed']} of {n['n']} seeds, R3 on {r['collapsed']} "
                f"of {r['n']} (Fisher p {tc['p']:.2g}); held-out area {m(n, 'heldout_area'):.2f} against "
                f"{m(r, 'heldout_area'):.2f} (none − R3 {ta['effect']:+.2f} [{ta['lo']:+.2f}, {ta['hi']:+.2f}], "
                f"paired p {ta['p']:.2g}); largest drawdown {m(n, 'max_drawdown'):.2f} against "
                f"{m(r, 'max_drawdown'):.2f} (p {td['p']:.2g}); kl trend {m(n, 'kl_trend'):+.2f} against "
                f"{m(r, 'kl_trend'):+.2f}.")
        assert f"{head} {line}" in text, (p, k)


def test_the_readme_quotes_round_5():
    """The README's round-5 headline says what the committed results/regime/confirm/confirm.json holds (which CI
    remakes from the committed records): how far it is, the rule's verdict, each setting's collapse counts with the
    Fisher and Holm p, what experiments.collapse's default became, and while the comparison runs, how far it is."""
    import json

    from experiments.collapse.protocol import DEFAULT_SETTING
    c = json.loads((ROOT / "results" / "regime" / "confirm" / "confirm.json").read_text())["confirmation"]
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    status = "complete" if c["complete"] else "partial"
    assert f"**Round 5 ({status}, {c['runs']} runs on fresh seeds 8-31" in text
    confirmed = [r["setting"] for r in c["rows"] if r["confirmed"]] if c["complete"] else []
    if not c["complete"]:
        verdict = f"not yet decided ({c['runs']} of {c['total']} runs in)"
    elif len(confirmed) == len(c["rows"]):
        verdict = "confirmed at both settings"
    elif confirmed:
        other = next(r["setting"] for r in c["rows"] if not r["confirmed"])
        verdict = f"confirmed at `{confirmed[0]}`, not at `{other}`"
    else:
        verdict = "not confirmed at either setting"
    assert f"R3's stability effect is {verdict}.**" in text
    for r in c["rows"]:
        assert (f"no replay fell on {r['collapsed_none']} of {r['n_none']} seeds and R3 on {r['collapsed_r3']} of "
                f"{r['n_r3']} (Fisher p {r['p']:.2g}, Holm {r['p_holm']:.2g};") in text, r["setting"]
    cmp = json.loads((ROOT / "results" / "regime" / "confirm" / "confirm.json").read_text())["comparison"]
    if not cmp["complete"]:
        assert f"is running: {cmp['runs']} of {cmp['total']} runs, its verdicts pending" in text
    if DEFAULT_SETTING == "headline":
        assert "keeps its default setting: **the rule did not confirm R3's effect**" in text or not c["complete"]
    else:
        assert f"`python -m experiments.collapse` now runs `{DEFAULT_SETTING}` by default" in text
