"""infer on Ray: a Ray Serve deployment serving the OpenAI API from an in-process engine
(``infer.ray.serve``) and a Ray Data processor for batch inference (``infer.ray.data``).

Both need ``pip install "ray[serve,data]"``; importing ``infer`` itself does not.
"""
