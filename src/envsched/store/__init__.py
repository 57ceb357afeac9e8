"""envsched.store"""
