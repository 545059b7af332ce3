"""What the terminal shows while a run is recorded: ``run``'s and ``attach``'s live panel.

:mod:`pace` follows the events as they are written (steps/s, the GPU's busy share now);
:mod:`snapshot` is the light analysis (the breakdown and the top finding so far), run on its own
thread at a cadence set by its cost; :mod:`view` puts them on the terminal, or nothing where
the off-switches say so. The words and screen codes are :mod:`gpudoctor.render.live_panel`'s.
"""
