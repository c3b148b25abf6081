"""GRPO vs SetPO+GRPO on a small language model pretrained from scratch on Countdown (issue 16).

python -m experiments.countdown_lm --out out/countdown_lm           # the full experiment (make experiment)
python -m experiments.countdown_lm --out out/countdown_lm --quick   # a few steps, one seed (make test)
"""
