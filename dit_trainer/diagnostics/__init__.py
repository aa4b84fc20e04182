"""Diagnostics that explain training failures instead of just raising them."""

from .gradient_flow import diagnose_gradient_flow
from .report import CODES, Finding, GradientReport

__all__ = ["CODES", "Finding", "GradientReport", "diagnose_gradient_flow"]
