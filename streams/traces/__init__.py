"""Import PyTorch profiler (Kineto / Chrome JSON) traces of many ranks into the detection core."""
