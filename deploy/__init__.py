"""perftracker_ml.deploy"""
