"""envsched.cli"""
