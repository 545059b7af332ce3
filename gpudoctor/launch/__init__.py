"""Starting and following the patient: launch a command, record it, keep the doctor's priority low.

``launcher`` is ``run``'s engine; ``recorder`` owns the samplers of one run; ``priority``, ``pids`` and
``proctree`` answer questions about processes (ours and the patient's).
"""
