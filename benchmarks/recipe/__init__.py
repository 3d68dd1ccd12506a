"""The recipe benchmark: which private training recipe gives adapters worth releasing, and do they beat a private
linear head on the frozen encoder (the floor)?

Protocol (recipes are chosen without the evaluated tasks' private data):

1. **select** — every candidate recipe of :data:`.grid.RECIPES` trains on the two *proxy* tasks
   (:data:`.grid.PROXY_TASKS`) at ε = 8, seed 0; each adapter is scored on its task's *validation* split. The
   recipe with the highest validation accuracy averaged over the proxies is the chosen one.
2. **report** — the floor, the packaged recipe (``DP_RECIPE``) and the chosen recipe train on the four *report* tasks
   (:data:`.grid.REPORT_TASKS`, never used to choose) at ε ∈ {1, 4, 8} and non-private; ε = 4 and ε = 8 run 3 seeds,
   the others 1. Each adapter is scored on its task's full *test* split.

Every unit (one adapter) is stored as JSON under ``benchmarks/reports/recipe/units/`` with the command line it was
trained with, so a run resumes where it stopped and a later session can finish a grid; ``--report-only`` rewrites
``benchmarks/reports/recipe/RECIPES.md`` from the stored units.
"""
