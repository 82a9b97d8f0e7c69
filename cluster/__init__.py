"""Cluster topology and launcher: from one machine to a multi-node Ray cluster."""
