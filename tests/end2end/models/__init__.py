"""Tests of end2end.models."""
