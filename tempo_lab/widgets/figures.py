"""The pure payload builders of every view (``go.Figure`` or HTML strings, no widgets), for
static use in notebooks and for tests that check views without a browser."""
from .graph import graph_figure, graph_spec, group_paths, matches, svg_of, to_dot
from .inspector import op_facts
from .memory_view import compare_memory, lifetime_rows, memory_figure
from .pass_view import grouped_notes, notes_html, pass_marks, pass_rows, pass_table_html, rst_html
from .profile_view import (
           compile_figure,
           compile_rows,
           estimated_kernels,
           icicle_data,
           icicle_figure,
           recorded_run,
           timeline_figure,
)
from .schedule_view import code_html, iteration_figure, iteration_space, tree_html

__all__ = ["graph_figure", "graph_spec", "group_paths", "matches", "svg_of", "to_dot", "op_facts", "compare_memory",
           "lifetime_rows", "memory_figure", "grouped_notes", "notes_html", "pass_marks", "pass_rows",
           "pass_table_html", "rst_html",
           "compile_figure", "compile_rows", "icicle_data", "icicle_figure",
           "estimated_kernels", "recorded_run", "timeline_figure", "code_html",
           "iteration_figure", "iteration_space", "tree_html"]
