"""The chart's alerts checked against the real components: a small PromQL evaluation over
scrapes of their real ``/metrics`` (``tsdb`` keeps the scrapes, ``promql`` evaluates, ``rules``
reads the chart's rule groups)."""
