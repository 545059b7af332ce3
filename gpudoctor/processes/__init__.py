"""Processes: the patient's, followed, and the doctor's own, started and kept out of the way.

``pids`` (is a process alive; waiting for a child), ``proctree`` (a process and its descendants,
refreshed cheaply), ``priority`` (the doctor's idle CPU and I/O priority), ``childpy`` (the doctor's
own Python children, started isolated, with the hooks booted under ``run``). One floor below the
samplers, which follow the tree, and above the hooks, which ``childpy`` installs in a child.
This file imports nothing: the attach payload imports ``pids`` inside the patient.
"""
