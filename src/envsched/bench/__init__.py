"""envsched.bench"""
