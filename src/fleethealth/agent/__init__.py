"""The node-local exporter (`fleethealth agent`): NVML readings and kernel-log Xids served as /metrics with
dcgm-exporter's names and labels, for nodes without DCGM."""
