"""miniTE workflow: prepare -> RL (recipes x seeds, ablations) -> eval, diagnose, throughput -> figures -> paper.

    snakemake --cores 2                                          # the tiny profile (default), all of it
    snakemake --cores 2 --config profile=h200 'seeds=[0,1]'      # another profile, overrides
    snakemake --cores 2 ablation_minite_bf16_router              # one ablation alone (RL, eval, diagnose)
    snakemake -n --config profile=paper                          # plan only (no checkpoint needed)

The profile is configs/<profile>.yaml (with `extends:`), then --configfile/--config overrides; the
merged config is validated against configs/profile.schema.yaml before anything is planned, and every
error names the key, the file (or --config) that set it, and the closest valid key. See README.md.
"""

import sys

from snakemake.utils import min_version

min_version("9.0")
sys.path.insert(0, str(workflow.basedir))  # minite.profiles, even when snakemake runs outside .venv

from minite.configuration import ConfigError
from minite.profiles import DEFAULT_PROFILE, load_profile

try:
    _merged = load_profile(config.get("profile", DEFAULT_PROFILE), dict(config))
except ConfigError as e:
    raise WorkflowError(str(e)) from None
config.clear()
config.update(_merged)


include: "workflows/common.smk"
include: "workflows/tracking.smk"
include: "workflows/prepare.smk"
include: "workflows/rl.smk"
include: "workflows/eval.smk"
include: "workflows/diagnose.smk"
include: "workflows/throughput.smk"
include: "workflows/figures.smk"


rule all:
    default_target: True
    input:
        all_targets(),
