"""Figure 9: the progressive ablation (configs, step classification, plot); see README.md."""
