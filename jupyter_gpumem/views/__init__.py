"""Views: text and HTML renderers, the widgets panel, the sidebar's comm, the plot.

They read snapshots and results; they never scan.
"""
