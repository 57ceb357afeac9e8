"""envsched.evaluation"""
