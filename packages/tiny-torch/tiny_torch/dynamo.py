"""placeholder"""
def register_backend() -> None: pass
