"""minite.claims.noise_calibration and `minite calibrate-noise`: the positive control's logit-noise
levels, calibrated from results-ledger records; and the committed calibration agrees with the levels
configs/ablations/ runs."""

import copy
import hashlib
import json
import math
from pathlib import Path

import pytest
import yaml

from minite.claims import noise_calibration as N
from minite.configuration import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "results" / "ledger" / "claims" / "te_nvfp4" / "seed0.json"


def test_a_noise_control_without_a_target_gap_or_level_is_refused():
    from minite.configuration import ConfigError

    with pytest.raises(ConfigError, match="no target gap or level"):
        N.NoiseControl("minite_noise_te")
    with pytest.raises(ConfigError, match="give one of level, target_gap, of"):
        N.NoiseControl("x", level=1.0, of="te_nvfp4")
    with pytest.raises(ConfigError, match="level must be a finite number > 0"):
        N.NoiseControl("x", level=float("nan"))
    with pytest.raises(ConfigError, match="multiple must be > 0"):
        N.NoiseControl("x", of="te_nvfp4", multiple=0)
    pts = [(1.0, 0.01), (10.0, 1.0)]  # gap = 0.01 std²: log-log slope 2
    assert N.NoiseControl("x", level=0.3).resolve(pts, {}) == 0.3
    assert N.NoiseControl("x", target_gap=0.04).resolve(pts, {}) == pytest.approx(2.0)
    assert N.NoiseControl("x", of="te", multiple=10).resolve(pts, {"te": 0.025}) == pytest.approx(5.0)
    with pytest.raises(ConfigError, match="no measured gap of arm 'te'"):
        N.NoiseControl("x", of="te").resolve(pts, {})


def test_calibrate_logit_noise_by_hand():
    pts = [(3.0, 0.09), (1.0, 0.01), (10.0, 1.0)]  # unsorted; gap = 0.01 std² everywhere
    assert N.calibrate_logit_noise(pts, 0.04) == pytest.approx(2.0)
    assert N.calibrate_logit_noise(pts, 0.0025) == pytest.approx(0.5)  # below the points: extrapolated
    assert N.calibrate_logit_noise(pts, 4.0) == pytest.approx(20.0)
    with pytest.raises(Exception, match="needs >= 2"):
        N.calibrate_logit_noise([(1.0, 0.01), (0.0, 0.0)], 0.1)


def _file(ledger: Path, arm: str, seed: int, level: float, gap: float | None) -> Path:
    """A ledger record of (arm, seed) at logit noise `level` whose run measured mean gap `gap`, made from
    a committed record (so it passes the ledger's validation)."""
    rec = copy.deepcopy(json.loads(TEMPLATE.read_text()))
    rec.update(arm=arm, seed=seed)
    rec["config"]["sampler"]["logit_noise"] = level
    rec["hash"] = hashlib.sha256(f"{arm} {level}".encode()).hexdigest()[:16]  # a level is a hash of its own
    if gap is None:
        del rec["summary"][N.GAP_KEY]
    else:
        rec["summary"][N.GAP_KEY] = gap
    path = ledger / "claims" / arm / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


CONTROLS = [
    N.NoiseControl("minite_noise_te", of="te_nvfp4", multiple=1),
    N.NoiseControl("minite_noise_te10", of="te_nvfp4", multiple=10),
]


@pytest.fixture
def ledger(tmp_path):
    root = tmp_path / "ledger"
    _file(root, "te_nvfp4", 0, 0.0, 0.042)
    _file(root, "te_nvfp4", 1, 0.0, 0.038)  # mean 0.04
    _file(root, "minite_noise_te", 0, 0.75, 0.037)  # 0.925x the target: kept
    _file(root, "minite_noise_te10", 0, 2.3, 0.21)
    _file(root, "minite_noise_te10", 1, 2.3, 0.23)  # mean 0.22: 0.55x the target 0.4
    return root


def test_a_level_near_its_target_is_kept_and_one_far_off_is_recalibrated(ledger):
    rec = N.calibration(ledger, "claims", CONTROLS, {"minite_noise_te": 0.75, "minite_noise_te10": 2.3})
    assert rec["naive"]["te_nvfp4"]["gap"] == pytest.approx(0.04)
    assert [(g["level"], g["n"]) for g in rec["levels"]] == [(0.75, 1), (2.3, 2)]
    te, te10 = rec["controls"]["minite_noise_te"], rec["controls"]["minite_noise_te10"]
    assert te["level"] == 0.75 and te["decision"].startswith("kept")
    assert te["ratio_now"] == pytest.approx(0.037 / 0.04)
    assert te10["target_gap"] == pytest.approx(0.4)
    assert te10["ratio_now"] == pytest.approx(0.22 / 0.4)
    assert te10["decision"].startswith("recalibrated")
    # the calibrated std lies on the power law through the two measured points, at the target gap
    slope = math.log(0.22 / 0.037) / math.log(2.3 / 0.75)
    assert 0.037 * (te10["calibrated"] / 0.75) ** slope == pytest.approx(0.4)
    assert te10["level"] == float(f"{te10['calibrated']:.2g}") == 3.3
    # the te-level control's own calibration is reported too, though its level is kept
    assert 0.037 * (te["calibrated"] / 0.75) ** slope == pytest.approx(0.04)


def test_a_control_never_run_at_its_configured_level_is_recalibrated(ledger):
    rec = N.calibration(ledger, "claims", CONTROLS, {"minite_noise_te": 0.5, "minite_noise_te10": 2.3})
    te = rec["controls"]["minite_noise_te"]
    assert te["gap_now"] is None and "no run at the configured level" in te["decision"]
    assert te["level"] == float(f"{te['calibrated']:.2g}")


def test_points_of_retired_records_come_from_the_previous_calibration(ledger, tmp_path):
    """A recalibrated level's records leave the ledger; the calibration that retired them still gives
    their points, and a ledger record of the same arm, seed and hash replaces its earlier point."""
    levels = {"minite_noise_te": 0.75, "minite_noise_te10": 3.3}
    first = N.calibration(ledger, "claims", CONTROLS, levels)
    for f in (ledger / "claims" / "minite_noise_te10").glob("*.json"):
        f.unlink()
    _file(ledger, "minite_noise_te10", 0, 3.3, 0.9)
    alone = N.calibration(ledger, "claims", CONTROLS, levels)
    assert [g["level"] for g in alone["levels"]] == [0.75, 3.3]
    both = N.calibration(ledger, "claims", CONTROLS, levels, previous=first["points"])
    assert [(g["level"], g["n"]) for g in both["levels"]] == [(0.75, 1), (2.3, 2), (3.3, 1)]
    te10 = both["controls"]["minite_noise_te10"]
    # the target 0.4 lies between the 2.3 and 3.3 points: interpolated on that segment
    slope = math.log(0.9 / 0.22) / math.log(3.3 / 2.3)
    assert 0.22 * (te10["calibrated"] / 2.3) ** slope == pytest.approx(0.4)
    assert te10["level"] == 2.7 and te10["ratio_now"] == pytest.approx(0.9 / 0.4)
    # the te-level control's own point is in the ledger and in `previous`: counted once
    again = N.calibration(ledger, "claims", CONTROLS, levels, previous=both["points"])
    assert [(g["level"], g["n"]) for g in again["levels"]] == [(0.75, 1), (2.3, 2), (3.3, 1)]


def test_bad_ledgers_are_refused_with_the_reason(ledger, tmp_path):
    levels = {"minite_noise_te": 0.75, "minite_noise_te10": 2.3}
    with pytest.raises(ConfigError, match="no record of 'te_nvfp4'"):
        N.calibration(tmp_path / "empty", "claims", CONTROLS, levels)
    with pytest.raises(ConfigError, match="tolerance must be in"):
        N.calibration(ledger, "claims", CONTROLS, levels, tolerance=1.5)
    with pytest.raises(ConfigError, match="no configured level for control 'minite_noise_te10'"):
        N.calibration(ledger, "claims", CONTROLS, {"minite_noise_te": 0.75})
    one = tmp_path / "one"
    _file(one, "te_nvfp4", 0, 0.0, 0.04)
    _file(one, "minite_noise_te10", 0, 2.3, 0.22)
    with pytest.raises(ConfigError, match="needs >= 2 measured noise levels"):
        N.calibration(one, "claims", CONTROLS[1:], {"minite_noise_te10": 2.3})
    bad = _file(ledger, "minite_noise_te", 1, 0.75, None)
    with pytest.raises(ConfigError, match=f"{bad}: the record's summary has no finite"):
        N.calibration(ledger, "claims", CONTROLS, levels)


def test_the_verb_writes_a_record_that_renders_as_published(ledger, tmp_path, capsys):
    from minite.commands.calibrate_noise import main
    from minite.results import render

    stem = tmp_path / "out" / "noise_calibration"
    args = ["--ledger", str(ledger), "--profile", "claims", "--record", str(stem)]
    args += ["--control", "minite_noise_te=te_nvfp4x1", "--control", "minite_noise_te10=te_nvfp4x10"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "minite_noise_te: logit_noise 0.75 (kept" in out
    assert "minite_noise_te10: logit_noise 3.3 (recalibrated" in out
    rec = json.loads(stem.with_suffix(".json").read_text())
    assert rec["kind"] == "noise_calibration" and rec["command"].startswith("minite calibrate-noise --ledger")
    assert rec["commit"] and rec["date"] and rec["machine"]
    md = stem.with_suffix(".md")
    assert md.read_text() == render(md)
    assert "| minite_noise_te10 | 10 x te_nvfp4 = 0.4 |" in md.read_text()
    assert main([*args[:4], "--control", "minite_noise_te10=te_nvfp4"]) == 2
    assert "expected ARM=OFxMULTIPLE" in capsys.readouterr().err
    assert main([*args, "--previous", str(TEMPLATE)]) == 2
    assert "not a calibration record" in capsys.readouterr().err
    assert main([*args, "--previous", str(stem.with_suffix(".json"))]) == 0


def test_the_ablation_files_run_the_committed_calibration():
    """configs/ablations/<control>.yaml holds the level results/reference/noise_calibration.json chose,
    and that record's numbers follow from its own points."""
    rec = json.loads((ROOT / "results" / "reference" / "noise_calibration.json").read_text())
    by_level: dict[float, list[float]] = {}
    for p in rec["points"]:
        by_level.setdefault(p["level"], []).append(p["gap"])
    assert [(g["level"], g["n"]) for g in rec["levels"]] == [(s, len(v)) for s, v in sorted(by_level.items())]
    for g in rec["levels"]:
        assert g["gap"] == pytest.approx(sum(by_level[g["level"]]) / g["n"])
    curve = [(g["level"], g["gap"]) for g in rec["levels"]]
    for arm, c in rec["controls"].items():
        level = yaml.safe_load((ROOT / "configs" / "ablations" / f"{arm}.yaml").read_text())["rl"]["sampler"]
        assert level["logit_noise"] == c["level"], arm
        target = c["multiple"] * rec["naive"][c["of"]]["gap"]
        assert c["target_gap"] == pytest.approx(target)
        assert c["calibrated"] == pytest.approx(N.calibrate_logit_noise(curve, target))
