"""perftracker.grafana"""
