"""``gpudoctor try``: apply a finding's fix to the command itself and measure it."""
