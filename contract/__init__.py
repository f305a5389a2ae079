"""What the controller and the runner agree on, owned by neither: stdlib only, imported by both.

The two programs never call each other; they meet on the shared volume and at the engine. This
package is everything both sides must read the same way: the chunk manifest (manifest.py), the
identity request and answer (identity.py), the per-item result lines (results.py), the runner's exit
codes (exits.py), the paths of a run folder (layout.py), container paths and how users see them
(paths.py), the model pack's rules (pack.py) and the ffmpeg command lines (ffmpeg.py).
Nothing here imports ``controller`` or ``runner_image`` (tests/unit/test_import_graph.py).
"""
