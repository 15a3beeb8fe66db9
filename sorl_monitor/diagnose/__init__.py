"""Diagnosis over the read path: detectors, the post-mortem, timelines, live verdicts, the fleet."""
