"""perftracker.deploy"""
