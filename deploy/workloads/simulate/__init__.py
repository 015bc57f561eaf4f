"""Scenario simulator for the detection benchmark (not shipped in the product path).

``events``: small data-parallel jobs as real EventBatch/HardwareBatch dicts (all three
stages run). ``patterns``: large data x tensor x pipeline layouts as FunctionPattern and
RankWindow dicts straight away (stages 2 and 3 run). ``scenarios``: the labelled families.
"""
