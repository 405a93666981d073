"""edgesched.sync"""
