"""The MLflow UI, in a real browser (Debian's headless Chromium over the DevTools protocol,
tests/workflow/browser.py), opens an experiment logged by minite on its run table, where the recipes'
runs are listed with their source (the `minite` verb) and dataset.

The link is the one the workflow prints and writes to results/<profile>/mlflow/server.json
(minite.tracking.store.ui_url). MLflow 3.17's UI chooses the landing tab from a GenAI / model-training
switch (default GenAI: the traces overview), so the link selects model training; the experiment
also carries `mlflow.experimentKind = custom_model_development`, which MLflow 3 UIs before that
switch read for the same choice. The screenshot is saved under the test's tmp dir (path printed).
"""

from __future__ import annotations

import pytest

from tests.workflow.browser import Browser, find_chromium

RECIPES = ("bf16", "te_nvfp4", "minite")


@pytest.mark.slow
def test_ui_opens_on_the_recipes_runs(mlflow_server, tmp_path, request):
    from minite.tracking import log_run
    from minite.tracking.store import ui_url

    if find_chromium() is None:
        pytest.skip("no chromium on PATH: `bash scripts/setup_system.sh` installs Debian's chromium")
    exp = f"ui_{request.node.name[-12:]}"
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(
        "".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(8))
    )
    refs = [
        log_run(
            experiment=exp,
            stage="rl",
            run=r,
            seed=0,
            verb="minite train",
            recipe=r,
            config={"recipe": r, "steps": 3},
            series=[("reward_mean", 0.1 * s, s) for s in range(3)],
            datasets=[(data / "train.jsonl", "training")],
            uri=mlflow_server.uri,
        )
        for r in RECIPES
    ]
    url = ui_url(mlflow_server.uri, refs[0]["experiment_id"])
    browser = Browser(tmp_path / "chromium-profile")
    try:
        browser.goto(url)
        names = [f"rl/{r}/seed0" for r in RECIPES]
        text = browser.wait_for_text(names + ["minite train", "data/train"], timeout=240)
        landed = browser.url()
        shot = browser.screenshot(tmp_path / "mlflow_ui_runs.png")
    finally:
        browser.close()
    print(f"MLflow UI screenshot: {shot}")
    assert f"/experiments/{refs[0]['experiment_id']}/runs" in landed, landed  # the run table, not traces
    assert "Run Name" in text and "Source" in text  # the run table's own columns
    assert shot.stat().st_size > 10_000
