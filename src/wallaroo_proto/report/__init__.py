"""Capture reports: ladder diagrams, time series and latency charts in one offline HTML file.

``collect.build_report`` dissects captures into a ``model.Report`` (bounded,
whatever their size); ``spark.build_report`` makes the same on Spark;
``html.write_report`` draws it. Protocol-agnostic: a plug-in adds its own
signals through ``ProtocolPlugin.report_signals`` (``signals``).
"""
