"""TODO trainer/watch"""
