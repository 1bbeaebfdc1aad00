"""The benchmark plumbing (not the figures): steady rates skip the warm-up window, and plots
are drawn from results files."""

import json

from bench import common, plots


def test_steady_rate_is_the_median_after_the_first_window(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "images_per_sec_total": rate} for rate in (5.0, 100.0, 90.0, 110.0)]
    rows.insert(2, {"kind": "val", "images_per_sec_total": 1.0})
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert common.steady_rate(metrics) == 100.0


def test_plots_are_drawn_from_results(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(plots, "RESULTS", tmp_path)
    (tmp_path / "scaling.json").write_text(
        json.dumps(
            {
                "workers": 2,
                "results": {
                    "horovod": {
                        "images_per_sec_1": 60.0,
                        "images_per_sec_2": 110.0,
                        "efficiency": 0.917,
                    }
                },
            }
        )
    )
    (tmp_path / "data_path.json").write_text(
        json.dumps(
            {
                "image_size": 224,
                "images_per_sec": {"folder": 400.0, "cache_decoded": 2400.0},
                "speedup_vs_folder": {"folder": 1.0, "cache_decoded": 6.0},
            }
        )
    )
    plots.main()
    for name in ("scaling.png", "data_path.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
