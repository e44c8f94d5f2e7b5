"""Analytic FLOPs and bytes per decoding phase against measured machine peaks."""
