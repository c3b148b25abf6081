"""SetPO for RL frameworks other than OpenRLHF. Each module needs its framework (pip extras `trl`, `verl`)."""
