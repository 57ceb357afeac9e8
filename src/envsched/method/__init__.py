"""envsched.method"""
