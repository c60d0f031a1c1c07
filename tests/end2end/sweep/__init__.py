"""Tests of end2end.sweep."""
