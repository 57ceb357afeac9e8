"""envsched.integrations"""
