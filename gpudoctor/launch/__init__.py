"""Starting the patient: launch a command under the recorder and build its report.

``launcher`` is ``run``'s engine; ``recorder`` owns the samplers of one run. What they ask about
processes (alive, the tree, the doctor's priority) is :mod:`gpudoctor.processes`, a floor below.
"""
