"""Tests of end2end.spec."""
