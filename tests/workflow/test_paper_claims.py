"""The report's Claims section (minite.figures.paper_report.claims_section): built from `minite claims`
output, with
its figures copied next to the report; absent when there is no claims.json."""

from __future__ import annotations

import json

from tests.claims.test_verdicts import BASE, MINITE_RECIPE, ROLES, write_run


def test_claims_section_from_the_verb_output(tmp_path):
    from minite.commands.claims import main
    from minite.figures.paper_report import claims_section

    rl, evs = [], []
    for run, qs in BASE.items():
        for s, q in enumerate(qs):
            rec = MINITE_RECIPE if run in ("minite", "minite_act") else None
            rewards = [0.3 + 0.01 * i for i in range(12)]
            d, ev = write_run(
                tmp_path / "results",
                run,
                s,
                rewards,
                [0.0 if run == "minite" else 0.05] * 12,
                evals={11: q},
                quality=q,
                recipe=rec,
            )
            rl.append(str(d))
            evs.append(str(ev))
    cdir = tmp_path / "claims"
    assert (
        main(
            [
                "--rl",
                *rl,
                "--evals",
                *evs,
                "--claims",
                json.dumps(ROLES),
                "--out",
                str(cdir),
                "--formats",
                "png",
                "--bench",
                str(tmp_path / "none"),
            ]
        )
        == 0
    )
    out = tmp_path / "paper"
    text = claims_section(cdir, out)
    assert text.lstrip().startswith("## Claims")
    for cid in ("C1", "C2", "C3", "C4", "C5"):
        assert f"| {cid} |" in text
    assert "### RL learning" in text and "| minite | 3 | 12 |" in text
    for name in ("claims_curves", "claims_final", "claims_dose"):
        assert f"(figures/{name}.png)" in text and (out / "figures" / f"{name}.png").is_file()
    assert claims_section(tmp_path / "empty", out) == ""
