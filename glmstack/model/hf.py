def load_hf(*a, **k): raise NotImplementedError
def save_hf(*a, **k): raise NotImplementedError
