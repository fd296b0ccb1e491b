"""Experiment reports: the paper's figures and tables from run directories (docs/experiments.md)."""
