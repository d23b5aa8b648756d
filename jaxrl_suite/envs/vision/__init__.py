"""Vision-language tasks (issue 46): scenes rendered on demand (scene.py), the `VisionTask`
base and IMAGE_MARKER (base.py), VisualThinker-R1-Zero's SAT-like spatial QA with its
CVBench-like held-out set (spatial_qa.py), the "base" VLM's pretraining corpus (pretrain.py),
the R1-Zero study's trace analysis (analysis.py), grid worlds solved by BFS and simulation
(maze.py) and SpatialTree's eleven sub-abilities over four levels (spatial_tree.py).
Importing this package registers its tasks in `envs.text.TASKS`. Numpy only."""

from jaxrl_suite.envs.vision.analysis import (
    FILLER_WORDS,
    Correction,
    Fact,
    grounded_fact_rate,
    grounded_facts,
    is_trivial_trace,
    self_corrections,
)
from jaxrl_suite.envs.vision.base import IMAGE_MARKER, VisionTask, accuracy_by, batch_images
from jaxrl_suite.envs.vision.maze import (
    MOVES,
    GridMap,
    bfs,
    draw_grid,
    fall,
    grid_of,
    grid_scene,
    simulate,
)
from jaxrl_suite.envs.vision.pretrain import (
    DOC_KINDS,
    TAGGED_DOMAINS,
    PretrainCorpus,
    PretrainDoc,
)
from jaxrl_suite.envs.vision.scene import (
    OBJECT_COLOURS,
    PALETTE,
    SHAPES,
    Scene,
    SceneObject,
    draw_scene,
    label_map,
    render,
    render_scenes,
    scene_key,
    scenes_key,
)
from jaxrl_suite.envs.vision.spatial_qa import (
    CATEGORIES,
    PROMPT_STYLES,
    TEMPLATES,
    SpatialMeta,
    SpatialQATask,
)
from jaxrl_suite.envs.vision.spatial_tree import (
    ABILITIES,
    LEVEL_OF,
    SOLUTION_STYLES,
    TREE_REWARDS,
    SpatialTreeTask,
    TreeMeta,
)

__all__ = [
    "ABILITIES",
    "CATEGORIES",
    "DOC_KINDS",
    "FILLER_WORDS",
    "IMAGE_MARKER",
    "LEVEL_OF",
    "MOVES",
    "OBJECT_COLOURS",
    "PALETTE",
    "PROMPT_STYLES",
    "SHAPES",
    "SOLUTION_STYLES",
    "TAGGED_DOMAINS",
    "TEMPLATES",
    "TREE_REWARDS",
    "Correction",
    "Fact",
    "GridMap",
    "PretrainCorpus",
    "PretrainDoc",
    "Scene",
    "SceneObject",
    "SpatialMeta",
    "SpatialQATask",
    "SpatialTreeTask",
    "TreeMeta",
    "VisionTask",
    "accuracy_by",
    "batch_images",
    "bfs",
    "draw_grid",
    "draw_scene",
    "fall",
    "grid_of",
    "grid_scene",
    "grounded_fact_rate",
    "grounded_facts",
    "is_trivial_trace",
    "label_map",
    "render",
    "render_scenes",
    "scene_key",
    "scenes_key",
    "self_corrections",
    "simulate",
]
