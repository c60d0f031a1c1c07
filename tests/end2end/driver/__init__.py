"""Tests of end2end.driver."""
