"""perftracker_ml.streams"""
