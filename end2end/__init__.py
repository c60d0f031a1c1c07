"""The end-to-end benchmark suite (Figure 7): configs, the training driver, baselines, plots."""
