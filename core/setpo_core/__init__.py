"""SetPO core: the paper's math, shared by the server, the trainers and the tests."""
