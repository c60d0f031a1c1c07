"""Tests of end2end.results."""
