"""Figure 8 (multi-node) launch scripts; see end2end/README.md."""
