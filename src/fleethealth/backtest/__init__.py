"""Backtest: replay a simulated scenario through the product's own decision loop and through baselines,
and score every arm against the scenario's ground truth (``fleethealth backtest``, ``fleethealth demo``).

    run = run_backtest(load_scenario("xid79-off-bus"), default_policy())
    result = evaluate(run)            # {"fleethealth": {...metrics}, "baselines": {...}}
    write_report(run, result, "report.html")
"""

from fleethealth.backtest.arms import BASELINE_HELP, BASELINES, PRODUCT
from fleethealth.backtest.runner import BacktestRun, run_backtest
from fleethealth.backtest.summary import evaluate

__all__ = ["BASELINES", "BASELINE_HELP", "PRODUCT", "BacktestRun", "evaluate", "run_backtest"]
